"""Helpers shared by the context tests (no tests here): configs, rows, builds, a summariser."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from fakes.llm import without_context

from gateway.config import AgentConfig, ContextConfig, LLMConfig
from gateway.context import ContextBuilder
from gateway.store import NewToolCall

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
MODEL = "test-model"


def configs(
    window: int = 0, *, reserve_pct: float = 0.0, verbatim: bool = False, hide_above: int = 16_000,
    tool_call_content: str = "empty", **context: Any,
):
    return (
        ContextConfig(**{"headroom_tokens": 0, **context}),
        LLMConfig(
            model=MODEL, context_window=window, reserve_pct=reserve_pct, verbatim_tool_results=verbatim,
            tool_call_content=tool_call_content,
        ),
        AgentConfig(max_tool_result_chars=hide_above),
    )


class RecordingSummariser:
    """Answers with a short summary and keeps every request it was given."""

    def __init__(self, text: str = "SUMMARY", *, fail: bool = False):
        self.text = text
        self.fail = fail
        self.requests: list[tuple[list[dict], int]] = []

    async def __call__(self, messages: list[dict], max_tokens: int) -> str:
        self.requests.append((messages, max_tokens))
        if self.fail:
            raise RuntimeError("summariser is down")
        return f"{self.text} {len(self.requests)}"


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict]] = []

    async def __call__(self, kind: str, payload: dict) -> None:
        self.seen.append((kind, payload))


def builder(store, window: int = 0, *, summarise=None, on_event=None, tool_lod=None, **options: Any) -> ContextBuilder:
    context, llm, agent = configs(window, **options)
    return ContextBuilder(store, context, llm, agent, summarise=summarise, on_event=on_event, tool_lod=tool_lod)


async def build(
    b: ContextBuilder,
    session,
    *,
    turn: int,
    notes: dict | None = None,
    reminder: str | None = None,
    system: str = "SYSTEM",
):
    return await b.build(
        session, system_prompt=system, turn_started_seq=turn, notes=notes or {}, now=NOW,
        timezone="Europe/Berlin", workspace="/srv/work", reminder=reminder, model=MODEL,
    )


async def user(store, session, text: str, **kw: Any):
    return await store.sessions.append(session.id, "user", text, **kw)


async def reply(store, session, text: str, **kw: Any):
    return await store.sessions.append(session.id, "assistant", text, **kw)


async def exchange(
    store, session, *calls: tuple[str, str], status: str = "done", text: str = "", note: str | None = None
):
    """An assistant row with tool calls given as (name, result)."""
    prefix = f"c{session.id}_{await store.sessions.count(session.id)}"
    new = [
        NewToolCall(f"{prefix}_{i}", name, json.dumps({"i": i}), status, result, note)
        for i, (name, result) in enumerate(calls)
    ]
    return await store.sessions.append(session.id, "assistant", text, calls=new)


async def turn(store, session, n: int, result_chars: int = 300, name: str = "read_file") -> int:
    """One whole turn (request, a tool exchange, an answer); returns its first seq."""
    first = await user(store, session, f"request {n}: please look at file {n}")
    await exchange(store, session, (name, f"<result {n}>" + "r" * result_chars + f"</result {n}>"))
    await reply(store, session, f"answer {n}: file {n} looks fine")
    return first.seq


def history_of(messages: list[dict]) -> list[dict]:
    """The messages after the system block, without the dynamic tail (its own message after
    tool results, else joined to the last user message)."""
    history = list(messages[1:])
    text = without_context(history[-1]["content"]) if history and history[-1]["role"] == "user" else None
    if text == "":
        history.pop()
    elif text is not None:
        history[-1] = {**history[-1], "content": text}
    return history


def check_well_formed(messages: list[dict]) -> None:
    """Every tool call is answered right after its message, in order; no stray results."""
    index = 0
    while index < len(messages):
        message = messages[index]
        assert message["role"] != "tool", f"tool result without its call at {index}"
        calls = message.get("tool_calls") or []
        results = messages[index + 1 : index + 1 + len(calls)]
        assert [r.get("tool_call_id") for r in results] == [c["id"] for c in calls]
        assert all(r["role"] == "tool" for r in results)
        index += 1 + len(calls)
