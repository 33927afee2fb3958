"""An MCP server's error text reaches the operator, not the chat or the model.

The attack: a server that fails at start writes a credential to its stderr (a token in its
arguments or environment echoed in a usage message, a URL with a password). The gateway keeps
the last stderr lines as the server's error (so the operator sees why); a chat member asking
/status, or the model calling one of the server's tools while it is down, must not be shown it,
and the error as the operator sees it (/readyz, the console, doctor, the log) has the configured
credential masked.
"""

from __future__ import annotations

import sys

from mcp_support import mcp_section
from test_telegram_e2e import PRIVATE, running, settle, texts, tg_config, tool_results

SECRET = "tok-7f3a9c1e"
LEAKY = {
    "command": [sys.executable, "-c", "import sys; print('bad token=' + sys.argv[1], file=sys.stderr); sys.exit(1)"],
    "args": [SECRET],
}


async def test_a_failed_servers_stderr_is_the_operators_alone(store, llm, tg, tmp_path, caplog) -> None:
    caplog.set_level("INFO")
    cfg = tg_config(llm, tg, tmp_path, mcp=mcp_section(leaky=LEAKY))
    llm.tool_call("mcp__leaky__lookup", {}, id="l1")  # a tool it offered before (e.g. in an earlier turn)
    llm.reply("It is down.")
    async with running(store, cfg) as gateway:
        await gateway.mcp.wait_for(lambda m: m.states["leaky"].restarts >= 1, 30)
        shown = gateway.mcp.summary()["leaky"]
        assert "bad token=••••" in shown["error"]  # the operator sees why (readyz, doctor), not the token
        assert SECRET not in shown["error"] and SECRET not in shown["target"] and SECRET not in caplog.text
        tg.private_message(PRIVATE, "look it up")
        await settle(gateway, lambda: "It is down." in texts(tg, PRIVATE))
        (result,) = tool_results(llm.requests[1])
        assert "The MCP server 'leaky' is not running" in result and SECRET not in result
        tg.private_message(PRIVATE, "/status")
        await settle(gateway, lambda: any("MCP leaky" in t for t in texts(tg, PRIVATE)))
        assert not any(SECRET in t for t in texts(tg, PRIVATE))
