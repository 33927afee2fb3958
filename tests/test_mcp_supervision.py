"""How the gateway supervises MCP servers written by others (the conformance tier,
tests/mcp_tier.py): a server that exits at start, or dies soon after connecting, is restarted
with a growing backoff and its state says why; one that lacks optional requests stays up."""

from __future__ import annotations

import shutil

import pytest
from mcp_support import FAST
from mcp_tier import python_server, unavailable_reason

from gateway.config import McpConfig
from gateway.mcp import McpManager
from gateway.tools import ToolRegistry

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")


async def restarts_seen(server: dict, count: int) -> list[tuple[float, str]]:
    """(retry_in_s, error) at each of the first `count` restarts of the server."""
    manager = McpManager(McpConfig.model_validate({"servers": {"s": server}, **FAST}), ToolRegistry())
    seen: dict[int, tuple[float, str]] = {}

    def record(m: McpManager) -> bool:
        state = m.states["s"]
        if state.status == "failed":
            seen.setdefault(state.restarts, (state.retry_in_s, state.error))
        return len(seen) >= count

    await manager.start()
    try:
        await manager.wait_for(record, 120)
    finally:
        await manager.stop()
    return [seen[n] for n in sorted(seen)][:count]


async def test_a_server_that_exits_at_start_is_retried_with_a_growing_backoff(tmp_path) -> None:
    not_a_repo = tmp_path / "plain"
    not_a_repo.mkdir()
    git = {"command": [str(python_server("mcp-server-git")), "--repository", str(not_a_repo)]}
    seen = await restarts_seen(git, 4)
    assert [delay for delay, _error in seen] == [0.1, 0.2, 0.4, 0.5]  # FAST: 0.1 s doubling, capped at 0.5 s
    # the state says why: what the server wrote to stderr before it exited
    assert all("not a valid Git repository" in error for _delay, error in seen), seen


@pytest.mark.skipif(shutil.which("timeout") is None, reason="coreutils timeout is not installed")
async def test_a_server_that_dies_soon_after_connecting_keeps_its_backoff_growing() -> None:
    # the real time server, ended by coreutils `timeout` a few seconds after it started
    time = {"command": ["timeout", "3", str(python_server("mcp-server-time"))]}
    seen = await restarts_seen(time, 4)
    assert [delay for delay, _error in seen] == [0.1, 0.2, 0.4, 0.5]
    assert any("after connecting" in error for _delay, error in seen), seen
