"""What `gateway status` asks outside the database, each part quickly and changing nothing: the
chat channels' tokens (getMe, auth.test), the model server (reachable, the model, its window),
the shell's sandbox, and the MCP servers as configured (never started: a stdio server's program
is looked for on PATH, a remote one's address is tried with a TCP connection).

Each returns a plain dict, the part of `gateway status --json` it answers.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from gateway.cli.channel_checks import Found, slack_bot, slack_socket_mode, telegram_bot
from gateway.cli.doctor import Check, model_ids, refused_key
from gateway.config import AgentConfig, Config, LLMConfig, McpConfig, McpServerConfig
from gateway.config.redaction import redact_text, redact_url
from gateway.llm import LLMClient
from gateway.tools.sandbox import doctor_checks as sandbox_checks
from gateway.tools.sandbox import sandbox_status


async def channels(config: Config, timeout_s: float) -> list[dict[str, Any]]:
    """Each configured chat channel: connected (its tokens answered), the bot's name, the mode."""
    probes = []
    if config.telegram.enabled:
        probes.append(_telegram(config, timeout_s))
    if config.slack.enabled:
        probes.append(_slack(config, timeout_s))
    return list(await asyncio.gather(*probes))


async def _telegram(config: Config, timeout_s: float) -> dict[str, Any]:
    found = await _within(telegram_bot(config.telegram.api_base_url, config.telegram.token), "telegram", timeout_s)
    return _channel("telegram", config.telegram.mode, found, f"@{found.name}" if found.name else "")


async def _slack(config: Config, timeout_s: float) -> dict[str, Any]:
    slack = config.slack
    found = await _within(slack_bot(slack.api_base_url, slack.bot_token), "slack", timeout_s)
    if found.ok and slack.app_token:  # Socket Mode needs the app-level token as well
        socket = await _within(_found(slack_socket_mode(slack.api_base_url, slack.app_token)), "slack", timeout_s)
        found = found if socket.ok else Found(socket.check, name=found.name)
    return _channel("slack", "socket" if slack.app_token else "http", found, found.name)


def _channel(name: str, mode: str, found: Found, bot: str) -> dict[str, Any]:
    check = found.check
    error = "" if found.ok else check.found + (f" -> {check.fix}" if check.fix else "")
    return {"name": name, "connected": found.ok, "bot": bot, "mode": mode, "error": error}


async def _within(probe: Awaitable[Found], name: str, timeout_s: float) -> Found:
    try:
        return await asyncio.wait_for(probe, timeout_s)
    except TimeoutError:
        return Found(Check(name, "fail", f"no answer within {timeout_s:g}s", "check the network and the api_base_url"))


async def _found(check: Awaitable[Check]) -> Found:
    return Found(await check)


async def model_server(llm: LLMConfig, timeout_s: float) -> dict[str, Any]:
    """The default model's server: reachable, whether it lists the model, the context window."""
    part: dict[str, Any] = {
        "base_url": redact_url(llm.base_url), "model": llm.model, "reachable": False, "listed": None,
        "window": None, "window_source": "", "error": "",
    }
    try:
        await asyncio.wait_for(_ask_model_server(llm, timeout_s, part), 2 * timeout_s)
    except TimeoutError:
        part["error"] = part["error"] or f"no answer within {2 * timeout_s:g}s"
    return part


async def _ask_model_server(llm: LLMConfig, timeout_s: float, part: dict[str, Any]) -> None:
    quick = llm.model_copy(update={"request_timeout_s": timeout_s, "connect_timeout_s": timeout_s, "max_retries": 0})
    async with LLMClient(quick) as client:
        url = client.server.base + "/models"
        try:
            response = await client.server.http.get(url)
        except httpx.HTTPError as exc:
            part["error"] = redact_text(f"cannot reach {url}: {exc or type(exc).__name__} -> check llm.base_url")
            return
        part["reachable"] = True
        if response.status_code in (401, 403):
            part["error"] = " -> ".join(refused_key(response.status_code, llm))
        elif response.status_code == 404:
            part["error"] = "HTTP 404 at /models -> llm.base_url usually ends in /v1 (gateway doctor says more)"
        ids = model_ids(response)
        part["listed"] = None if ids is None else llm.model in ids
        if llm.context_window != "auto":
            part["window"], part["window_source"] = llm.context_window, "llm.context_window"
        elif not part["error"]:
            window = await client.context_window()
            part["window"], part["window_source"] = window.tokens, window.source


def sandbox(agent: AgentConfig) -> dict[str, Any]:
    """The shell's sandbox (bubblewrap's first check runs it: call this off the loop)."""
    checks = sandbox_checks(agent)
    if not checks:
        return {"shell": False, "mode": "", "level": "ok", "found": "the shell is not offered (agent.tools)", "fix": ""}
    _, level, found, fix = checks[0]
    return {"shell": True, "mode": sandbox_status(agent.shell_sandbox).mode, "level": level, "found": found, "fix": fix}


async def mcp_servers(mcp: McpConfig, timeout_s: float) -> list[dict[str, Any]]:
    """Each configured MCP server, not started: found (stdio) or accepting connections (url)."""
    return list(await asyncio.gather(*(_mcp_server(name, server, timeout_s) for name, server in mcp.servers.items())))


async def _mcp_server(name: str, server: McpServerConfig, timeout_s: float) -> dict[str, Any]:
    part: dict[str, Any] = {"name": name, "transport": "stdio" if server.command else server.transport,
                            "enabled": server.enabled, "reachable": None, "note": ""}
    if not server.enabled:
        part["note"] = "disabled"
    elif server.command:
        program = server.command[0]
        part["reachable"] = bool(shutil.which(program) or Path(program).is_file())
        shown = Path(program).name
        part["note"] = f"{shown} found" if part["reachable"] else f"{shown} not found (mcp.servers.{name}.command)"
    else:
        part["reachable"], part["note"] = await _accepts(server.url, timeout_s)
    if server.auth == "oauth":
        part["note"] += f"; OAuth (gateway mcp login {name})"
    return part


async def _accepts(url: str, timeout_s: float) -> tuple[bool, str]:
    """Whether the server's address takes a TCP connection (nothing is sent: a GET could open a stream)."""
    parts = urlsplit(url)
    try:
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except (OSError, ValueError, TimeoutError) as exc:
        return False, redact_text(f"{redact_url(url)}: no connection ({exc or type(exc).__name__})")
    writer.close()
    return True, f"{redact_url(url)} accepts connections"
