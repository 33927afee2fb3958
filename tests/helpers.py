"""Helpers the end-to-end and flow tests share: waiting for a condition, reading what the
gateway sent to the model, a clock the test moves by hand, and a web app served on loopback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from fakes.llm import Reply, user_texts

from gateway.events import utcnow
from gateway.tools.sandbox import sandbox_status

# A test that runs commands in the shell sandbox: skipped, with the reason, where bubblewrap cannot run.
needs_bwrap = pytest.mark.skipif(
    bool(sandbox_status("auto").problem), reason=f"bubblewrap cannot sandbox here: {sandbox_status('auto').problem}"
)


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until `condition()` holds (checked every 10 ms); TimeoutError after `timeout`."""

    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), timeout)


def tool_results(request: dict[str, Any]) -> list[str]:
    """The tool results in a request to the model, in order (Chat Completions' tool messages,
    Anthropic's tool_result blocks or Responses' function_call_output items)."""
    if "input" in request:
        return [item["output"] for item in request["input"] if item.get("type") == "function_call_output"]
    found = []
    for m in request["messages"]:
        if m["role"] == "tool":
            found.append(m["content"])
        elif isinstance(m.get("content"), list):
            found += [b.get("content", "") for b in m["content"] if b.get("type") == "tool_result"]
    return found


# The APIs a test marked so runs against, each through its own fake (the `llm` fixture).
EVERY_API = ("chat", "anthropic", "responses")
every_api = pytest.mark.parametrize("llm", EVERY_API, indirect=True)


def echo(request: dict[str, Any]) -> Reply:
    """A model that answers "re: " and the last thing the user said."""
    return Reply(f"re: {user_texts(request)[-1]}")


class ManualClock:
    """A `gateway.running.clock.Clock` that stands still until the test advances it: an expiry or a
    timeout is reached by `advance`, not by sleeping past a timer. Starts at the real time, so
    the rows it dates sort among the others."""

    def __init__(self, start: datetime | None = None):
        self._now = start or utcnow()
        self._monotonic = 1000.0

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._monotonic

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)
        self._monotonic += seconds


def session_file(workspace: Path, name: str) -> Path:
    """A file a tool wrote, in the directory of the session that wrote it
    (`<workspace>/sessions/<id>/`); a path that does not exist when no session has it."""
    found = sorted(Path(workspace).glob(f"sessions/*/{name}"))
    assert len(found) <= 1, found
    return found[0] if found else Path(workspace) / "sessions" / "none" / name


class Site:
    """A test web site's state: the paths it was asked for, its base URL once served, and an
    event its slow pages wait on."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.release = asyncio.Event()
        self.base = ""


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """`app` served on 127.0.0.1 (a free port) while the block runs; yields its base URL."""
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
