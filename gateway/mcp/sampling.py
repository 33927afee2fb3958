"""A server's sampling request (it asks to use our model), answered by the configured model
when `mcp.servers.<name>.sampling` allows it. The completion goes through the LLM client, so
the spend caps check and count it for the turn's payer; its tokens and its cost (at
`llm.prices`, or the provider's own figure) are added to the run, and so to the session's
totals (an `MCP_SAMPLING` event). It uses the model of the turn that made the tool call.

The server chooses how long an answer it asks for and how often it asks, so both are capped per
call: `max_tokens` is clamped to `sampling_max_tokens`, and a call gets `sampling_per_call`
requests answered; one more ends the call (the server would otherwise spend the payer's budget
at its own discretion).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gateway.config import McpServerConfig
from gateway.llm.pricing import usage_cost
from gateway.mcp.sdk import SamplingAnswer, SamplingRequest
from gateway.tools.registry import ToolContext, ToolError
from gateway.traces.runs import current_spending, llm_totals, usage_payload

log = logging.getLogger(__name__)


class PerCall:
    """The sampling requests one tool call has had answered (kept across a parked call's rounds)."""

    def __init__(self, server: str, config: McpServerConfig, used: int = 0):
        self.server, self.limit, self.used = server, config.sampling_per_call, used

    def ensure_room(self, count: int = 1) -> None:
        """Refuse when `count` more requests would pass the limit (a batch is refused whole,
        before any of it is spent)."""
        if self.used + count > self.limit:
            raise ToolError(
                f"The MCP server {self.server!r} asked to use the model (sampling) more than {self.limit} times "
                f"in one call (mcp.servers.{self.server}.sampling_per_call); the call was abandoned."
            )

    def take(self) -> None:
        self.ensure_room()
        self.used += 1


def ensure_enabled(server: str, config: McpServerConfig, ctx: ToolContext) -> None:
    if not config.sampling or ctx.services.get("llm") is None:
        raise ToolError(
            f"The MCP server {server!r} asked to use the model (sampling), which is not enabled for it "
            f"(mcp.servers.{server}.sampling); the call was not finished."
        )


async def sample(
    server: str, config: McpServerConfig, request: SamplingRequest, ctx: ToolContext, per_call: PerCall
) -> SamplingAnswer:
    ensure_enabled(server, config, ctx)
    per_call.take()
    llm = ctx.services["llm"]
    messages = ([{"role": "system", "content": request.system_prompt}] if request.system_prompt else []) + [
        {"role": "assistant" if role == "assistant" else "user", "content": text} for role, text in request.messages
    ]
    started = time.monotonic()
    try:
        spending = current_spending.get()
        model = spending.model if spending is not None else None
        limit = min(request.max_tokens or config.sampling_max_tokens, config.sampling_max_tokens)
        completion = await llm.complete(messages, max_tokens=limit, model=model)
    except Exception as exc:  # noqa: BLE001 - a budget reached, the model down: the server is told no
        raise ToolError(f"The MCP server {server!r} asked to use the model (sampling), which failed: {exc}") from None
    await _record(ctx, server, completion, time.monotonic() - started)
    return SamplingAnswer(completion.text, completion.model)


async def _record(ctx: ToolContext, server: str, completion: Any, seconds: float) -> None:
    usage = completion.usage
    config = ctx.services.get("config")
    if usage is not None:
        cost = usage_cost(config.llm.price_of(completion.model) if config is not None else None, usage)
        totals = llm_totals(completion.model, usage, cost)
        totals.pop("model")  # the run's model stays its rounds'
    else:
        cost, totals = None, {"llm_calls": 1}
    payload = {
        "server": server,
        "model": completion.model,
        "duration_ms": round(seconds * 1000, 2),
        "output_chars": len(completion.text),
        "usage": usage_payload(usage) if usage is not None else None,
        "cost_nano_usd": cost,
    }
    store = ctx.services.get("store")
    if store is None or not ctx.run_id:
        return
    try:
        await store.runs.add_events(ctx.run_id, [("MCP_SAMPLING", payload, None)], **totals)
    except Exception:  # noqa: BLE001 - a trace write never fails the call
        log.exception("run %s: could not record MCP_SAMPLING", ctx.run_id)
