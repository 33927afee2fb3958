"""Run records: one run per turn, its events, usage and cost, and the one writer of its stage.

A trace write that fails is logged and swallowed: observability must never fail a turn. The
stage writes a caller builds on (reopening a parked run, canceling a parked one, abandoning a
dead worker's) raise. Outside this class a run's stage is written only in the store's own
transactions that need it whole: a new run beside the one it continues (`DelegationRepo.restart`)
and the reply's delivery with the `FinalStage` given by `end_with` (`gateway/delivery/outbox.py`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from gateway.config import ModelPrice, TracesConfig
from gateway.events import Delivered
from gateway.llm.events import Usage
from gateway.llm.pricing import NANO_PER_USD, usage_cost
from gateway.serving import metrics
from gateway.store import Fence, FinalStage, LeaseLost, Store

log = logging.getLogger(__name__)

__all__ = [
    "NANO_PER_USD", "RunTrace", "Spending", "cap_payload", "current_spending", "format_nano_usd", "llm_totals",
    "usage_payload",
]


def cap_utf8(text: str, limit: int) -> str:
    """Cut `text` to at most `limit` UTF-8 bytes without splitting a character."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    cut = data[:limit].decode("utf-8", errors="ignore")
    return f"{cut}… [{len(data) - len(cut.encode('utf-8'))} more bytes]"


def cap_payload(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return cap_utf8(value, limit)
    if isinstance(value, dict):
        return {k: cap_payload(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [cap_payload(v, limit) for v in value]
    return value


PriceOf = Callable[[str], ModelPrice | None]  # a model's prices by the name runs record (LLMConfig.price_of)


def llm_totals(model: str, usage: Usage, cost: int | None, **counts: int) -> dict[str, Any]:
    """The run's totals of one LLM call (a round, a summary, a sub-agent's, a sampling request)."""
    return dict(
        model=model,
        cost_nano_usd=cost,
        unpriced=cost is None,
        usage_estimated=usage.estimated,
        input_tokens=usage.prompt_tokens,
        cached_tokens=usage.cached_tokens,
        cache_write_tokens=usage.cache_write_tokens,
        output_tokens=usage.completion_tokens,
        reasoning_tokens=usage.reasoning_tokens,
        llm_calls=1,
        **counts,
    )


def usage_payload(usage: Usage) -> dict[str, Any]:
    """A call's usage as its trace event shows it (the names of the run's totals)."""
    return {
        "input_tokens": usage.prompt_tokens,
        "cached_tokens": usage.cached_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "output_tokens": usage.completion_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
        "estimated": usage.estimated,
        "provider_cost_usd": usage.cost_usd,
    }


@dataclass(frozen=True)
class Spending:
    """The run an LLM call besides a round is counted on (a summary, a sampling request), and
    the model its turn uses: set by the turn for its task (`current_spending`)."""

    trace: RunTrace
    model: str


current_spending: ContextVar[Spending | None] = ContextVar("current_spending", default=None)


class RunTrace:
    """The events and the stage of one run. Event writes swallow store errors after logging them."""

    def __init__(
        self,
        store: Store,
        run_id: int,
        *,
        config: TracesConfig,
        prices: PriceOf,
        fence: Fence | None = None,
    ):
        self.store = store
        self.run_id = run_id
        self.fence = fence  # the turn's thread lease: its end is written only while it holds it
        self.limit = config.max_payload_chars
        self.prices = prices
        self.ended = False  # the final stage is written: a later `end` writes nothing

    async def event(
        self, kind: str, payload: dict[str, Any], *, parent_seq: int | None = None, **totals: Any
    ) -> int | None:
        seqs = await self._events([(kind, payload, parent_seq)], **totals)
        return seqs[-1] if seqs else None

    async def _events(self, events: list[tuple[str, dict[str, Any], int | None]], **totals: Any) -> list[int]:
        capped = [(kind, cap_payload(payload, self.limit), parent) for kind, payload, parent in events]
        try:
            return await self.store.runs.add_events(self.run_id, capped, **totals)
        except Exception:  # noqa: BLE001 - a trace write never fails the turn
            log.exception("run %s: could not record %s", self.run_id, ", ".join(kind for kind, _, _ in events))
            return []

    def llm_call(
        self, *, request: dict[str, Any], response: dict[str, Any], model: str, usage: Usage, latency_ms: float
    ) -> tuple[list[tuple[str, dict[str, Any], int | None]], dict[str, Any]]:
        """LLM_REQUEST and LLM_RESPONSE (both complete when the call is) and the run's totals,
        for the round's own transaction to write (Store.record_round); the response's seq is
        what TOOL_CALL events link to."""
        cost = self.cost(model, usage)
        events = [
            ("LLM_REQUEST", {**request, "latency_ms": round(latency_ms, 2)}, None),
            (
                "LLM_RESPONSE",
                {**response, "usage": usage_payload(usage), "cost_nano_usd": cost, "latency_ms": round(latency_ms, 2)},
                None,
            ),
        ]
        totals = llm_totals(model, usage, cost, rounds=1)
        return [(kind, cap_payload(payload, self.limit), parent) for kind, payload, parent in events], totals

    def cost(self, model: str, usage: Usage) -> int | None:
        """What the call cost (counted in the cost metric too)."""
        cost = usage_cost(self.prices(model), usage)
        if cost:
            metrics.COST.labels(model).inc(cost / 1e9)
        return cost

    async def aux_call(self, kind: str, model: str, usage: Usage | None, payload: dict[str, Any]) -> None:
        """An LLM call besides the rounds (a summary, a sampling request): its event and totals."""
        used = usage or Usage(estimated=True)
        cost = self.cost(model, used) if usage is not None else None
        body = {**payload, "model": model, "usage": usage_payload(used), "cost_nano_usd": cost}
        totals = llm_totals(model, used, cost)
        totals.pop("model")  # the run's model stays its rounds'
        await self.event(kind, body, **totals)

    def tool_call_trace(
        self,
        *,
        name: str,
        call_id: str,
        status: str,
        duration_ms: float,
        parent_seq: int | None,
        detail: dict[str, Any] | None = None,
    ) -> tuple[list[tuple[str, dict[str, Any], int | None]], dict[str, Any]]:
        """The TOOL_CALL event and the run's totals, for the write of the call's result to
        carry (Store.settle_tool_call)."""
        payload = {
            "name": name,
            "call_id": call_id,
            "status": status,
            "duration_ms": round(duration_ms, 2),
            **(detail or {}),
        }
        return [("TOOL_CALL", cap_payload(payload, self.limit), parent_seq)], {"tool_calls": 1}

    async def error(self, stage: str, message: str) -> None:
        await self.event("RUN_ERROR", {"stage": stage, "message": message})

    # ---- the stage: written here only -----------------------------------------------------
    async def reopen(self) -> None:
        """A parked run goes on (its prompt was decided)."""
        await self.store.runs.set_stage(self.run_id, "RUNNING")

    async def end(self, stage: str, *, end_reason: str, error: str | None = None) -> None:
        """The run's stage when its turn ends (RUNNING: it is continued after a restart)."""
        if self.ended:
            return
        try:
            await self.store.runs.set_stage(self.run_id, stage, end_reason=end_reason, error=error, fence=self.fence)
        except LeaseLost:
            # Another instance took the thread over: it continues the run (left RUNNING); a
            # stage written now (parked, say) would hide it from that continuation.
            raise
        except Exception:  # noqa: BLE001 - like a trace write, a stage write never fails the turn
            log.exception("run %s: could not set stage %s", self.run_id, stage)

    async def end_with(self, stage: str, end_reason: str, write: Callable[[FinalStage], Awaitable[Delivered]]) -> None:
        """The final stage written by `write` in a write of its own: the reply's delivery, so
        that a reply is never sent without its run being finished, nor the other way round. A
        reply found delivered already (a continued run) finished nothing: the stage is written
        here, fenced like every stage of the run."""
        delivered = await write(FinalStage(self.run_id, stage, end_reason))
        if not delivered.finished_run:
            await self.end(stage, end_reason=end_reason)
        self.ended = True

    async def cancel(self) -> None:
        """A parked run canceled by /stop (its open calls were canceled first)."""
        await self.store.runs.set_stage(self.run_id, "CANCELED", end_reason="canceled")
        self.ended = True

    async def abandon(self, why: str) -> None:
        """The run's worker died mid-turn and the run is not continued in place: failed, saying why."""
        await self.store.runs.add_event(self.run_id, "RUN_ERROR", {"stage": "restart", "message": why})
        await self.store.runs.set_stage(self.run_id, "FAILED", end_reason="error", error="restart")
        self.ended = True


def format_nano_usd(value: int | None, unpriced: bool = False) -> str:
    if value is None:
        return "unpriced"
    text = f"${value / NANO_PER_USD:.6f}".rstrip("0").rstrip(".")
    return text + (" (+ unpriced calls)" if unpriced else "")
