"""An older MCP server that speaks only the SSE transport."""

from __future__ import annotations

from mcp_support import FAST, http_server

from gateway.config import AgentConfig, McpConfig
from gateway.events import ThreadKey
from gateway.mcp import McpManager
from gateway.tools import InMemoryNotes, ToolContext, ToolRegistry, run_tool


async def test_a_server_on_the_sse_transport_serves_its_tools(tmp_path) -> None:
    async with http_server(tmp_path / "state", transport="sse") as url:
        server = {"url": url, "transport": "sse", "trusted": True, "timeout_s": 20}
        registry = ToolRegistry()
        manager = McpManager(McpConfig.model_validate({"servers": {"old": server}, **FAST}), registry)
        await manager.start()
        try:
            await manager.wait_for(lambda m: m.states["old"].status == "running", 30)
            ctx = ToolContext(
                1, ThreadKey("console", "1", ""), "console", True, tmp_path, AgentConfig(), InMemoryNotes()
            )
            outcome = await run_tool(registry.get("mcp__old__lookup"), {"key": "k"}, ctx)
            assert outcome.text == "value of k" and not outcome.failed
            assert manager.summary()["old"]["tools"] == 10
            asked = await run_tool(registry.get("mcp__old__confirm"), {"item": "gate"}, ctx)
            assert asked.ask is not None and asked.ask.choices == ["red", "green", "blue", "Decline"]
        finally:
            await manager.stop()
