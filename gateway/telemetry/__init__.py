"""Traces people can export: OpenTelemetry spans over OTLP/HTTP when `telemetry.otlp_endpoint`
is set, and nothing at all (not even an import of OpenTelemetry) when it is empty.

One trace per run. Its root is the turn span, whose ids the run record keeps (`runs.trace_id`,
`runs.trace_span_id`), so the spans of a turn that parked on an approval and was resumed by
another instance, or after a restart, are one trace. Its children are written as their work
ends: an LLM call, a tool call, an approval wait, a send. The turn span itself goes out when
the run ends, with the run's start as its start.

The turn sets its `RunSpans` as the current ones (`within`) for as long as it runs: code below
it (the outbox) adds spans to the current run without being handed anything, and log lines
written meanwhile name the trace. With telemetry off there is never a current run, and each
instrumented place costs one context-variable read.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar, Token
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

from gateway.telemetry.values import Attributes, clean, now_ns, ns_of, usd

if TYPE_CHECKING:
    from gateway.config import TelemetryConfig


class SpanNote(Protocol):
    """An open span: what it learned while running, and whether it failed."""

    def set(self, key: str, value: str | int | float | bool) -> None: ...

    def fail(self, error: str) -> None: ...


class RunSpans(Protocol):
    """The spans of one run, children of its turn span."""

    trace_id: str

    def record(
        self, name: str, start_ns: int, end_ns: int | None = None, attributes: Attributes | None = None,
        *, error: str | None = None,
    ) -> None:
        """A span whose work is over (an LLM call, a tool call, an approval wait)."""

    def span(self, name: str, attributes: Attributes | None = None) -> AbstractContextManager[SpanNote]:
        """A span around work still to do (a send); an exception marks it failed."""

    def end_turn(
        self, started_at: datetime, attributes: Attributes, *, error: str | None = None, name: str = "turn"
    ) -> None:
        """The turn span itself, from the run's start until now: written once, when the run ends."""


class Telemetry(Protocol):
    def run(self, trace_id: str, span_id: str) -> RunSpans: ...

    def describe(self) -> str: ...

    async def shutdown(self) -> None: ...


__all__ = ["Attributes", "RunSpans", "SpanNote", "Telemetry", "build", "clean", "current", "current_trace_id"]
__all__ += ["enter", "leave", "now_ns", "ns_of", "record", "usd", "within"]

_current: ContextVar[RunSpans | None] = ContextVar("gateway_run_spans", default=None)


def build(config: TelemetryConfig, *, instance_id: str) -> Telemetry | None:
    """The exporter for `config`, or None when telemetry is off (OpenTelemetry stays unimported)."""
    if not config.enabled:
        return None
    from gateway.telemetry.otlp import OtlpTelemetry

    return OtlpTelemetry(config, instance_id=instance_id)


def current() -> RunSpans | None:
    """The spans of the run being worked on in this task, if it is traced."""
    return _current.get()


def current_trace_id() -> str | None:
    spans = _current.get()
    return spans.trace_id if spans is not None else None


def enter(spans: RunSpans) -> Token[RunSpans | None]:
    return _current.set(spans)


def leave(token: Token[RunSpans | None]) -> None:
    _current.reset(token)


@contextmanager
def within(spans: RunSpans | None) -> Iterator[None]:
    if spans is None:
        yield
        return
    token = _current.set(spans)
    try:
        yield
    finally:
        _current.reset(token)


def record(
    name: str, start_ns: int, end_ns: int | None = None, attributes: Attributes | None = None,
    *, error: str | None = None,
) -> None:
    """A finished span in the current run; nothing when there is none."""
    spans = _current.get()
    if spans is not None:
        spans.record(name, start_ns, end_ns, attributes, error=error)

