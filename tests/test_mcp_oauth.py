"""A remote MCP server behind OAuth (tests/mcp_server/oauth_server.py: the SDK's MCPServer with
its authorization server, on loopback), through the gateway's use of the SDK's OAuth client:
without stored tokens the server is "needs login", not a crash loop; `gateway mcp login`
prints the link, takes the browser's redirect, stores the tokens encrypted; the gateway then
runs the server's tools, refreshing expired tokens. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fakes.llm import Reply
from helpers import until
from mcp_support import FAST, free_port, serving
from test_chat_cli import child_env
from test_telegram_e2e import PRIVATE, running, settle, texts, tg_config, tool_results

from gateway.cli.mcp_login import login
from gateway.config import McpConfig
from gateway.mcp.manager import doctor_checks, state_line
from gateway.mcp.oauth import KEY_VARIABLE, TokenVault, new_key

OAUTH_SERVER = Path(__file__).parent / "mcp_server" / "oauth_server.py"


@contextlib.asynccontextmanager
async def oauth_server(token_ttl: int = 3600) -> AsyncIterator[str]:
    port = free_port()
    async with serving([sys.executable, str(OAUTH_SERVER), str(port), "--token-ttl", str(token_ttl)], port):
        yield f"http://127.0.0.1:{port}/mcp"


@pytest.fixture
def key(monkeypatch) -> str:  # noqa: ANN001
    value = new_key()
    monkeypatch.setenv(KEY_VARIABLE, value)
    return value


def server(url: str) -> dict:
    return {"url": url, "auth": "oauth", "oauth_redirect": f"http://127.0.0.1:{free_port()}/callback", "trusted": True}


async def browse(said: list[str]) -> str:
    """The person's browser: opens the printed link, is sent back to the loopback callback."""
    await until(lambda: any("/authorize?" in line for line in said), 20)
    link = next(word for line in said for word in line.split() if "/authorize?" in word)
    async with httpx.AsyncClient(follow_redirects=True) as http:
        response = await http.get(link)
    return response.text


async def test_without_tokens_it_needs_login_then_runs_after_gateway_mcp_login(store, llm, tg, tmp_path, key) -> None:
    async with oauth_server() as url:
        mcp = {"servers": {"t": server(url)}, **FAST}
        cfg = tg_config(llm, tg, tmp_path, mcp=mcp, approvals={"rules": [{"tool": "mcp__t__*", "action": "allow"}]})
        llm.tool_call("mcp__t__whoami", {}, id="w1")
        llm.responder = lambda request: Reply(f"result: {tool_results(request)[-1]}")
        async with running(store, cfg) as gateway:
            await gateway.mcp.wait_for(lambda m: m.states["t"].status == "needs_login", 20)
            await asyncio.sleep(1.5)  # three of restart_max_s: looked at again, never restarted as a crash
            state = gateway.mcp.summary()["t"]
            assert state["status"] == "needs_login" and state["restarts"] == 0
            assert "gateway mcp login t" in state["error"]
            assert state_line("t", state) == "MCP t: 🔑 needs login (gateway mcp login t)"

            said: list[str] = []
            browser = asyncio.create_task(browse(said))
            assert await login(cfg, "t", store, say=said.append, timeout=30) == 0
            assert "Signed in" in await browser
            assert said[-1].startswith("signed in to t: 1 tools")

            await gateway.mcp.wait_for(lambda m: m.states["t"].status == "running", 20)
            tg.private_message(PRIVATE, "who am I")
            await settle(gateway, lambda: any(t.startswith("result:") for t in texts(tg, PRIVATE)))
            assert tool_results(llm.requests[-1])[-1].startswith("signed in")
        sealed = await store.mcp_tokens.get("t", "tokens")
        tokens = await TokenVault(store, "t", key).load("tokens")
        assert sealed and tokens and '"access_token"' in tokens
        assert "access_token" not in sealed  # encrypted at rest
        assert await TokenVault(store, "t", new_key()).load("tokens") is None  # another key reads nothing


async def test_expired_tokens_are_refreshed(store, tmp_path, key) -> None:
    from gateway.mcp import McpManager
    from gateway.tools import ToolRegistry

    async with oauth_server(token_ttl=31) as url:  # within TOKEN_MARGIN_S + 1 of expiring
        mcp = McpConfig.model_validate({"servers": {"t": server(url)}, **FAST})
        from gateway.config import Config

        cfg = Config.model_validate({"mcp": mcp.model_dump()})
        said: list[str] = []
        browser = asyncio.create_task(browse(said))
        assert await login(cfg, "t", store, say=said.append, timeout=30) == 0
        await browser
        first = await TokenVault(store, "t", key).load("tokens")
        await asyncio.sleep(1.5)  # the access token is about to expire (or has)
        registry = ToolRegistry()
        manager = McpManager(mcp, registry, vaults=lambda name: TokenVault.from_env(store, name))
        await manager.start()
        try:
            await manager.wait_for(lambda m: m.states["t"].status == "running", 20)
        finally:
            await manager.stop()
        assert await TokenVault(store, "t", key).load("tokens") != first  # refreshed and stored again


async def test_the_doctor_says_needs_login(store, tmp_path, key) -> None:
    async with oauth_server() as url:
        config = McpConfig.model_validate({"servers": {"t": server(url)}, **FAST})
        vaults = lambda name: TokenVault.from_env(store, name)  # noqa: E731
        ((name, status, found, fix),) = await doctor_checks(config, timeout=20, vaults=vaults)
        assert (name, status, found, fix) == ("MCP t", "fail", "needs login", "run `gateway mcp login t`")


def test_gateway_mcp_login_prints_the_link_and_signs_in(tmp_path) -> None:
    async def scenario() -> None:
        async with oauth_server() as url:
            callback = free_port()
            config = tmp_path / "config.yml"
            config.write_text(
                f"database:\n  url: sqlite:///{tmp_path / 'gateway.db'}\n"
                f"mcp:\n  servers:\n    t:\n      url: {url}\n      auth: oauth\n"
                f"      oauth_redirect: http://127.0.0.1:{callback}/callback\n"
            )
            env = {**child_env(), KEY_VARIABLE: new_key()}
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway", "mcp", "login", "t", "--config", str(config), "--log-level", "error",
                env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
            assert process.stdout is not None
            said: list[str] = []
            while not any("/authorize?" in line for line in said):
                line = await asyncio.wait_for(process.stdout.readline(), 60)
                assert line, (await process.stderr.read()).decode() if process.stderr else ""
                said.append(line.decode())
            assert said[0].startswith("Open this link to sign in to t:")
            await browse(said)
            out, err = await asyncio.wait_for(process.communicate(), 60)
            assert process.returncode == 0, err.decode()
            assert "signed in to t: 1 tools" in out.decode()

    asyncio.run(scenario())
