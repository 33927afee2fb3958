"""The test MCP server (tests/mcp_server/server.py, written with the SDK) as the gateway's
tool server: over stdio as a subprocess the gateway starts, or over Streamable HTTP on
loopback as a process the test starts."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

SERVER = Path(__file__).parent / "mcp_server" / "server.py"
FAST = {"restart_initial_s": 0.1, "restart_max_s": 0.5, "health_interval_s": 0.3}


def stdio_server(state: Path, **settings: Any) -> dict[str, Any]:
    return {"command": [sys.executable, str(SERVER), "--state", str(state)], "timeout_s": 20, **settings}


def mcp_section(**servers: dict[str, Any]) -> dict[str, Any]:
    return {"servers": servers, **FAST}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def http_server(state: Path, transport: str = "http") -> AsyncIterator[str]:
    """The server on Streamable HTTP (or SSE) at 127.0.0.1; yields its /mcp (or /sse) url."""
    port = free_port()
    argv = [sys.executable, str(SERVER), f"--{transport}", str(port), "--state", str(state)]
    async with serving(argv, port):
        yield f"http://127.0.0.1:{port}/{'mcp' if transport == 'http' else 'sse'}"


@contextlib.asynccontextmanager
async def serving(argv: list[str], port: int) -> AsyncIterator[None]:
    """A server process (`argv`) the test starts, once it accepts connections on `port`."""
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            await asyncio.sleep(0.05)
        yield
    finally:
        process.kill()
        process.wait()


async def until_running(gateway: Any, name: str = "t", timeout: float = 30.0) -> None:
    await gateway.mcp.wait_for(lambda m: m.states[name].status == "running", timeout)


def notes(state: Path) -> list[str]:
    """What the server's side-effecting tool has written."""
    file = state / "notes.txt"
    return file.read_text().splitlines() if file.exists() else []


def offered(request: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in request.get("tools") or []]
