"""The conformance tier through Telegram: MCP servers written by others (tests/mcp_tier.py,
the reference servers from PyPI and npm, pinned) <- the gateway's MCP client -> turns and
approvals shown through real PTB to FakeTelegram, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from mcp_support import mcp_section
from mcp_tier import python_server, unavailable_reason
from test_telegram_e2e import PRIVATE, running, settle, texts, tg_config, tool_results

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=unavailable_reason() or "")


def time_server(**settings):
    return {"command": [str(python_server("mcp-server-time")), "--local-timezone", "UTC"], **settings}


async def test_the_time_server_stays_connected_while_its_health_is_checked(store, llm, tg, tmp_path) -> None:
    cfg = tg_config(llm, tg, tmp_path, mcp=mcp_section(time=time_server(trusted=True)))
    llm.tool_call("mcp__time__get_current_time", {"timezone": "Europe/Paris"}, id="t1")
    llm.reply("It is late.")
    async with running(store, cfg) as gateway:
        # several health checks (a tool listing each) on one connection, and never a restart
        await gateway.mcp.wait_for(lambda m: m.states["time"].checks >= 5 or m.states["time"].restarts > 0, 60)
        state = gateway.mcp.summary()["time"]
        assert (state["status"], state["restarts"], state["error"]) == ("running", 0, "")
        assert state["protocol"] and state["server"].startswith("mcp-time")
        tg.private_message(PRIVATE, "what time is it in Paris?")
        await settle(gateway, lambda: "It is late." in texts(tg, PRIVATE))
        (result,) = tool_results(llm.requests[1])
        assert '"timezone": "Europe/Paris"' in result and "datetime" in result
