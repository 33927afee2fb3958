"""The OpenTelemetry SDK behind `gateway.telemetry`: one tracer provider of the gateway's own
(not the global one: a library that traces through the global API, like the MCP SDK, stays
quiet), a batch processor with a bounded queue, and the OTLP/HTTP protobuf exporter.

The processor exports from its own thread: a span ended on the event loop is put in a queue
and nothing more, so a slow or unreachable collector never holds up a turn; when the queue is
full new spans are dropped (the SDK logs it). The one module that imports OpenTelemetry."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from importlib import metadata

from opentelemetry import trace as trace_api
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from gateway.config import TelemetryConfig
from gateway.config.redaction import redact_url
from gateway.telemetry.values import Attributes, clean, now_ns, ns_of

log = logging.getLogger(__name__)
KINDS = {"send": SpanKind.CLIENT, "chat": SpanKind.CLIENT}


class _PresetIds(IdGenerator):
    """Random ids, except the turn span's: the run record chose those when the run started."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._preset: ContextVar[tuple[int, int] | None] = ContextVar("gateway_preset_ids", default=None)

    @contextmanager
    def preset(self, trace_id: int, span_id: int) -> Iterator[None]:
        token = self._preset.set((trace_id, span_id))
        try:
            yield
        finally:
            self._preset.reset(token)

    def generate_trace_id(self) -> int:
        preset = self._preset.get()
        return preset[0] if preset is not None else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        preset = self._preset.get()
        return preset[1] if preset is not None else self._random.generate_span_id()


def _version() -> str:
    try:
        return metadata.version("chat-gateway")
    except metadata.PackageNotFoundError:
        return "0"


class OtlpTelemetry:
    def __init__(self, config: TelemetryConfig, *, instance_id: str):
        self.config = config
        version = _version()
        resource = Resource.create(
            {
                "service.name": config.service_name,
                "service.version": version,
                "service.instance.id": instance_id,
                **config.resource_attributes,
            }
        )
        self.exporter = OTLPSpanExporter(
            endpoint=config.traces_url, headers=dict(config.otlp_headers) or None, timeout=config.export_timeout
        )
        self.processor = BatchSpanProcessor(
            self.exporter,
            max_queue_size=config.max_queue,
            schedule_delay_millis=config.export_interval * 1000,
            max_export_batch_size=config.max_batch,
            export_timeout_millis=config.export_timeout * 1000,
        )
        self.ids = _PresetIds()
        # Shut down by `shutdown` within its bound, not at exit (which would wait for a down collector).
        self.provider = TracerProvider(resource=resource, id_generator=self.ids, shutdown_on_exit=False)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("gateway", version)

    def describe(self) -> str:
        return (
            f"traces to {redact_url(self.config.traces_url)} (OTLP/HTTP, service {self.config.service_name}, "
            f"a batch every {self.config.export_interval:g}s, at most {self.config.max_queue} spans queued)"
        )

    def run(self, trace_id: str, span_id: str) -> OtlpRunSpans:
        return OtlpRunSpans(self, int(trace_id, 16), int(span_id, 16))

    async def shutdown(self) -> None:
        """The last spans go out, waited for at most `shutdown_timeout`; past that the exporter
        stops retrying, and a request still under way is left to the process's exit."""
        done = threading.Event()

        def stop() -> None:
            try:
                self.provider.shutdown()
            finally:
                done.set()

        threading.Thread(target=stop, name="telemetry-shutdown", daemon=True).start()
        deadline = asyncio.get_running_loop().time() + self.config.shutdown_timeout
        while not done.is_set() and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if not done.is_set():
            log.warning("telemetry: the last spans were not exported within %gs", self.config.shutdown_timeout)
            self.exporter.shutdown()  # its retries stop waiting: the processor's thread ends soon


class _Note:
    def __init__(self, span: trace_api.Span):
        self._span = span

    def set(self, key: str, value: str | int | float | bool) -> None:
        self._span.set_attribute(key, value)

    def fail(self, error: str) -> None:
        self._span.set_status(Status(StatusCode.ERROR, error))


class OtlpRunSpans:
    def __init__(self, telemetry: OtlpTelemetry, trace_id: int, span_id: int):
        self._telemetry = telemetry
        self._tracer = telemetry.tracer
        self._trace_id, self._span_id = trace_id, span_id
        self.trace_id = f"{trace_id:032x}"
        turn = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        self._parent = trace_api.set_span_in_context(NonRecordingSpan(turn), Context())

    def record(
        self, name: str, start_ns: int, end_ns: int | None = None, attributes: Attributes | None = None,
        *, error: str | None = None,
    ) -> None:
        span = self._tracer.start_span(
            name, context=self._parent, kind=_kind(name), attributes=clean(attributes or {}), start_time=start_ns
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=end_ns if end_ns is not None else now_ns())

    @contextmanager
    def span(self, name: str, attributes: Attributes | None = None) -> Iterator[_Note]:
        span = self._tracer.start_span(
            name, context=self._parent, kind=_kind(name), attributes=clean(attributes or {}),
            record_exception=False, set_status_on_exception=False,
        )
        try:
            yield _Note(span)
        except BaseException as exc:
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            span.end()

    def end_turn(
        self, started_at: datetime, attributes: Attributes, *, error: str | None = None, name: str = "turn"
    ) -> None:
        with self._telemetry.ids.preset(self._trace_id, self._span_id):
            span = self._tracer.start_span(
                name, context=Context(), kind=SpanKind.INTERNAL, attributes=clean(attributes),
                start_time=ns_of(started_at),
            )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end()


def _kind(name: str) -> SpanKind:
    return KINDS.get(name.split(" ", 1)[0], SpanKind.INTERNAL)
