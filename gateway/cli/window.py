"""`gateway doctor`'s line about the model's window: what it leaves out of a request.

The request is fitted exactly as `gateway serve` fits it (the same tools, the same estimate
calibrated by the server's tokenizer), so what doctor says is what the start log says.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.cli.doctor import Check, Report
from gateway.config import Config

FIX = (
    "a larger window keeps them (llama.cpp: --ctx-size, Ollama: num_ctx); agent.tool_priority names the "
    "tools to keep first, agent.tools offers fewer"
)


async def window_check(config: Config, report: Report, *, on_check: Callable[[Check], None]) -> None:
    """Adds its check to `report` (the model server's checks), once the server answered them."""
    if report.failed:
        return
    from gateway.app import Gateway
    from gateway.store import Store

    store = Store("sqlite+aiosqlite:///:memory:")  # the tools' specs need one; nothing is read or written
    gateway = Gateway(config, channels={}, serve_http=False, store=store)
    try:
        fit = await gateway.fit_configured_tools(quiet=True)
    finally:
        await gateway.llm.aclose()
        await store.close()
    on_check(report.add("request fit", "warn" if fit.cut else "ok", fit.describe(), FIX if fit.cut else ""))
