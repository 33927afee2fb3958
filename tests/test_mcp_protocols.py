"""Every published protocol version is first-class: a server pinned to each handshake-era
version (tests/mcp_server/legacy.py, which answers "Method not found" to everything newer)
and the SDK-written test server on the newest version connect once, stay connected while
their health is checked, and serve text, image, error and (from 2025-06-18) structured calls;
tool list changes arrive on each."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mcp_support import FAST, SERVER

from gateway.config import AgentConfig, McpConfig
from gateway.events import ThreadKey
from gateway.mcp import McpManager
from gateway.tools import InMemoryNotes, ToolContext, ToolRegistry, run_tool

LEGACY = Path(__file__).parent / "mcp_server" / "legacy.py"
HANDSHAKE_VERSIONS = ["2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25"]


def context(tmp_path) -> ToolContext:
    return ToolContext(1, ThreadKey("console", "1", ""), "console", True, tmp_path, AgentConfig(), InMemoryNotes())


async def started(server: dict) -> tuple[McpManager, ToolRegistry]:
    registry = ToolRegistry()
    manager = McpManager(McpConfig.model_validate({"servers": {"p": server}, **FAST}), registry)
    await manager.start()
    return manager, registry


@pytest.mark.parametrize("version", HANDSHAKE_VERSIONS)
async def test_a_server_on_each_handshake_version_is_served(tmp_path, version) -> None:
    manager, registry = await started({"command": [sys.executable, str(LEGACY), "--version", version]})
    try:
        await manager.wait_for(lambda m: m.states["p"].checks >= 3 or m.states["p"].restarts > 0, 60)
        state = manager.summary()["p"]
        assert (state["status"], state["restarts"], state["protocol"]) == ("running", 0, version)
        assert state["server"] == f"legacy-{version} 1.0"
        ctx = context(tmp_path)
        assert (await run_tool(registry.get("mcp__p__echo"), {"text": "hi"}, ctx)).text == "echo: hi"
        picture = await run_tool(registry.get("mcp__p__picture"), {}, ctx)
        assert "[image/png saved to the workspace: mcp/p/" in picture.text
        failed = await run_tool(registry.get("mcp__p__fail"), {}, ctx)
        assert failed.failed and "it failed" in failed.text
        if version >= "2025-06-18":
            weather = await run_tool(registry.get("mcp__p__weather"), {}, ctx)
            assert "21" in weather.text and "weather://today" in weather.text
        else:
            assert registry.get("mcp__p__weather") is None
        await run_tool(registry.get("mcp__p__grow"), {}, ctx)  # the server announces a changed list
        await manager.wait_for(lambda m: m.registry.get("mcp__p__sprout") is not None, 10)
        assert manager.summary()["p"]["restarts"] == 0
    finally:
        await manager.stop()


async def test_the_newest_version_is_served_with_its_change_stream(tmp_path) -> None:
    manager, registry = await started({"command": [sys.executable, str(SERVER), "--state", str(tmp_path)]})
    try:
        await manager.wait_for(lambda m: m.states["p"].checks >= 3 or m.states["p"].restarts > 0, 60)
        state = manager.summary()["p"]
        assert (state["status"], state["restarts"], state["protocol"]) == ("running", 0, "2026-07-28")
        assert manager.connections["p"].change_stream  # this server implements subscriptions/listen
        ctx = context(tmp_path)
        assert (await run_tool(registry.get("mcp__p__lookup"), {"key": "k"}, ctx)).text == "value of k"
    finally:
        await manager.stop()


async def test_a_server_without_tools_is_running_with_none_not_restarted(tmp_path) -> None:
    manager, _ = await started({"command": [sys.executable, str(LEGACY), "--version", "2025-06-18", "--no-tools"]})
    try:
        await manager.wait_for(lambda m: m.states["p"].checks >= 3 or m.states["p"].restarts > 0, 60)
        state = manager.summary()["p"]
        assert (state["status"], state["restarts"], state["tools"]) == ("running", 0, 0)
    finally:
        await manager.stop()
