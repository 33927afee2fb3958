"""Helpers the end-to-end and flow tests share: waiting for a condition, and reading what the
gateway sent to the model."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fakes.llm import Reply, user_texts


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until `condition()` holds (checked every 10 ms); TimeoutError after `timeout`."""

    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), timeout)


def tool_results(request: dict[str, Any]) -> list[str]:
    """The tool results in a request to the model, in order."""
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


def echo(request: dict[str, Any]) -> Reply:
    """A model that answers "re: " and the last thing the user said."""
    return Reply(f"re: {user_texts(request)[-1]}")
