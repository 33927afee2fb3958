"""An OTLP/HTTP trace receiver on loopback: what a collector's `otlp` receiver does with
`POST /v1/traces` (protobuf `ExportTraceServiceRequest` in, `ExportTraceServiceResponse` out,
gzip understood), decoded with the protocol's own generated types (`opentelemetry-proto`).

It keeps every span it got, flattened with its resource's attributes, and can be told to
stall (hold each request open until released) or to refuse (answer with an error status), to
show what a collector that is slow or down does to the gateway."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as ProtoStatus

PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root
    kind: str  # SPAN_KIND_INTERNAL, SPAN_KIND_CLIENT, ...
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: str  # STATUS_CODE_UNSET | STATUS_CODE_OK | STATUS_CODE_ERROR
    status_message: str
    resource: dict[str, Any] = field(default_factory=dict)
    scope: str = ""


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=ProtoSpan.SpanKind.Name(span.kind),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=_attributes(span.attributes),
                        status=ProtoStatus.StatusCode.Name(span.status.code),
                        status_message=span.status.message,
                        resource=resource,
                        scope=scope_spans.scope.name,
                    )
                )
    return spans


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests: list[dict[str, str]] = []  # the headers of each export request
        self.refuse_with: int | None = None  # answer every export with this status
        self.released = asyncio.Event()
        self.released.set()  # clear() to stall: requests are held open until set() again
        self.stalled = 0  # requests that arrived while stalled
        self.url = ""  # the base URL, as `telemetry.otlp_endpoint` takes it
        self._runner: web.AppRunner | None = None
        self._changed = asyncio.Event()

    async def __aenter__(self) -> OtlpReceiver:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.released.set()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        self.requests.append(dict(request.headers))
        if not self.released.is_set():
            self.stalled += 1
            await self.released.wait()
        if self.refuse_with is not None:
            return web.Response(status=self.refuse_with, text="refused by the test")
        if request.content_type != PROTOBUF:
            return web.Response(status=415, text=f"expected {PROTOBUF}")
        body = await request.read()
        encoding = request.headers.get("Content-Encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        try:
            spans = decode(body)
        except Exception as exc:  # noqa: BLE001 - a collector answers 400 to what it cannot parse
            return web.Response(status=400, text=f"not an ExportTraceServiceRequest: {exc}")
        self.spans.extend(spans)
        self._changed.set()
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(), content_type=PROTOBUF)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]

    async def wait_for(self, done: Any, timeout: float = 30.0) -> None:
        """Until `done()` holds for what was received (raises TimeoutError with what came)."""
        async with asyncio.timeout(timeout):
            while not done():
                self._changed.clear()
                await self._changed.wait()
