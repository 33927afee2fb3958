"""A server's sampling request (it asks to use our model), answered by the configured model
when `mcp.servers.<name>.sampling` allows it. The completion goes through the LLM client, so
the spend caps check and count it for the turn's payer; its tokens and its cost (at
`llm.prices`, or the provider's own figure) are added to the run, and so to the session's
totals (an `MCP_SAMPLING` event). It uses the model of the turn that made the tool call.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gateway.config import McpServerConfig
from gateway.llm.pricing import usage_cost
from gateway.mcp.sdk import SamplingAnswer, SamplingRequest
from gateway.tools.registry import ToolContext, ToolError
from gateway.traces import current_spending, llm_totals, usage_payload

log = logging.getLogger(__name__)


async def sample(server: str, config: McpServerConfig, request: SamplingRequest, ctx: ToolContext) -> SamplingAnswer:
    llm = ctx.services.get("llm")
    if not config.sampling or llm is None:
        raise ToolError(
            f"The MCP server {server!r} asked to use the model (sampling), which is not enabled for it "
            f"(mcp.servers.{server}.sampling); the call was not finished."
        )
    messages = ([{"role": "system", "content": request.system_prompt}] if request.system_prompt else []) + [
        {"role": "assistant" if role == "assistant" else "user", "content": text} for role, text in request.messages
    ]
    started = time.monotonic()
    try:
        spending = current_spending.get()
        model = spending.model if spending is not None else None
        completion = await llm.complete(messages, max_tokens=request.max_tokens or None, model=model)
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
