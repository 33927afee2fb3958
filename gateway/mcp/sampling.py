"""A server's sampling request (it asks to use our model), answered by the configured model
when `mcp.servers.<name>.sampling` allows it. The completion goes through the LLM client, so
the spend caps check and count it for the turn's payer; its tokens and its cost (at
`llm.prices`) are added to the run, and so to the session's totals (an `MCP_SAMPLING` event).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from gateway.config import McpServerConfig
from gateway.mcp.sdk import SamplingAnswer, SamplingRequest
from gateway.tools.registry import ToolContext, ToolError
from gateway.traces import cost_nano_usd

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
        completion = await llm.complete(messages, max_tokens=request.max_tokens or None)
    except Exception as exc:  # noqa: BLE001 - a budget reached, the model down: the server is told no
        raise ToolError(f"The MCP server {server!r} asked to use the model (sampling), which failed: {exc}") from None
    await _record(ctx, server, completion, time.monotonic() - started)
    return SamplingAnswer(completion.text, completion.model)


async def _record(ctx: ToolContext, server: str, completion: Any, seconds: float) -> None:
    usage = completion.usage
    totals: dict[str, Any] = {"llm_calls": 1}
    if usage is not None:
        config = ctx.services.get("config")
        prices = config.llm.prices if config is not None else {}
        cost = cost_nano_usd(
            prices.get(completion.model),
            input_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            output_tokens=usage.completion_tokens,
        )
        totals |= {
            "input_tokens": usage.prompt_tokens,
            "cached_tokens": usage.cached_tokens,
            "output_tokens": usage.completion_tokens,
            "cost_nano_usd": cost,
            "unpriced": cost is None,
            "usage_estimated": usage.estimated,
        }
    payload = {
        "server": server,
        "model": completion.model,
        "duration_ms": round(seconds * 1000, 2),
        "output_chars": len(completion.text),
        "cost_nano_usd": totals.get("cost_nano_usd"),
    }
    store = ctx.services.get("store")
    if store is None or not ctx.run_id:
        return
    try:
        await store.runs.add_events(ctx.run_id, [("MCP_SAMPLING", payload, None)], **totals)
    except Exception:  # noqa: BLE001 - a trace write never fails the call
        log.exception("run %s: could not record MCP_SAMPLING", ctx.run_id)
