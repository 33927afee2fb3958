"""The conformance tier's servers as the gateway configures them, and what they work on: a
temporary git repository, a directory, a loopback web page, server-everything over Streamable
HTTP. The servers themselves are built by tests/mcp_tier.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web
from mcp_support import free_port
from mcp_tier import node_server, python_server

PAGE = "<html><head><title>Tier page</title></head><body><h1>Opening hours</h1><p>We open at nine.</p></body></html>"


def time_server(**settings: Any) -> dict[str, Any]:
    return {"command": [str(python_server("mcp-server-time")), "--local-timezone", "UTC"], **settings}


def git_server(repo: Path, **settings: Any) -> dict[str, Any]:
    return {"command": [str(python_server("mcp-server-git")), "--repository", str(repo)], **settings}


def fetch_server(**settings: Any) -> dict[str, Any]:
    # the server fetches (not the gateway): loopback must be allowed to it, and robots.txt ignored
    command = [str(python_server("mcp-server-fetch")), "--ignore-robots-txt", "--allow-private-ips"]
    return {"command": command, **settings}


def everything_stdio(**settings: Any) -> dict[str, Any]:
    return {"command": [str(node_server("mcp-server-everything")), "stdio"], **settings}


def filesystem_server(root: Path, **settings: Any) -> dict[str, Any]:
    return {"command": [str(node_server("mcp-server-filesystem")), str(root)], **settings}


def git_repo(where: Path) -> Path:
    """A repository with one commit of `README.md`."""
    where.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "Ann", "GIT_AUTHOR_EMAIL": "ann@example.org"}
    env |= {"GIT_COMMITTER_NAME": "Ann", "GIT_COMMITTER_EMAIL": "ann@example.org"}
    (where / "README.md").write_text("# Tier repo\n")
    for command in (["init", "-q", "-b", "main"], ["add", "README.md"], ["commit", "-q", "-m", "First words"]):
        subprocess.run(["git", *command], cwd=where, env=env, check=True)
    return where


@contextlib.asynccontextmanager
async def loopback_page() -> AsyncIterator[str]:
    """A web page on 127.0.0.1; yields its url."""
    app = web.Application()

    async def page(_request: web.Request) -> web.Response:
        return web.Response(text=PAGE, content_type="text/html")

    app.router.add_get("/hours", page)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}/hours"
    finally:
        await runner.cleanup()


class EverythingHttp:
    """server-everything serving Streamable HTTP on a loopback port; killed and started again
    on the same port by the tests that need a server to vanish and come back."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.process = subprocess.Popen(
            [str(node_server("mcp-server-everything")), "streamableHttp"],
            env={**os.environ, "PORT": str(self.port)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(600):
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            await asyncio.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None


@contextlib.asynccontextmanager
async def everything_http() -> AsyncIterator[EverythingHttp]:
    server = EverythingHttp()
    await server.start()
    try:
        yield server
    finally:
        server.kill()


async def until_a_call_runs(store: Any, timeout: float = 60.0) -> None:
    """Until some session's tool call is running (sent to its server, not yet answered)."""

    async def running() -> bool:
        for session in await store.sessions.list(10):
            if any(c.status == "running" for c in await store.sessions.open_tool_calls(session.id)):
                return True
        return False

    async with asyncio.timeout(timeout):
        while not await running():
            await asyncio.sleep(0.02)
