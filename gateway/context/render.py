"""Rendering stored rows as OpenAI chat messages, and the text transforms applied on the way.

Everything here is render-time only: the database keeps full results and clean text. A row
renders the same way every time for the same `Mode`, which is what keeps the prompt prefix
byte-identical from one round to the next.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gateway.context.budget import message_chars
from gateway.llm.formats import REPLAY_KEY
from gateway.store.history import HistoryCall, HistoryRow

Lod = Literal["head", "tail", "both"]
Message = dict[str, Any]

INTERRUPTED = "Error: tool call was interrupted before it finished. Please retry."
NO_OUTPUT = "(no output)"
FAILED_PREFIX = "[failed] "
MIN_STUB_KEEP = 100


@dataclass(frozen=True)
class Mode:
    """How a row is rendered: from a previous turn, level-of-detail stubbed, capped, and
    whether its images go along (a recent turn, with `llm.vision`)."""

    previous_turn: bool
    lod: bool
    cap: bool
    images: bool = False


# Renders are cached by an int key: images * 8 + previous_turn * 4 + lod * 2 + cap.
MODES = tuple(Mode(bool(k & 4), bool(k & 2), bool(k & 1), bool(k & 8)) for k in range(16))
ImagePart = Callable[[dict[str, Any]], "tuple[Message, int] | None"]  # image record -> (part, chars)


@dataclass(frozen=True)
class Limits:
    hide_above: int  # agent.max_tool_result_chars: results of previous turns above it are hidden
    lod_above: int  # context.lod_above_chars
    cap: int  # context.max_tool_result_chars
    verbatim: bool  # llm.verbatim_tool_results
    image_part: ImagePart | None = None  # None: images are never attached (no llm.vision)
    null_call_content: bool = False  # llm.tool_call_content == "null": `content: null` beside tool_calls


@dataclass(frozen=True)
class RenderedRow:
    messages: tuple[Message, ...]
    chars: int


def neutralise(text: str) -> str:
    """`<|` opens chat-template control tokens; a tool result must not be able to forge a turn."""
    return text.replace("<|", "&lt;|")


def tool_text(call: HistoryCall) -> str:
    """What the model sees for a call, by status, so every call always has a result."""
    result = call.result or ""
    if call.status == "done":
        return result or NO_OUTPUT
    if call.status == "failed":
        return "Error: " + (result.removeprefix(FAILED_PREFIX) or "the tool failed without a message")
    if call.status == "rejected":
        return call.note or result or "The call was rejected."
    if call.status == "cancelled":
        return call.note or result or "The call was cancelled."
    return INTERRUPTED


def hidden_note(name: str, length: int, limit: int) -> str:
    return (
        f"[Tool result for `{name}` hidden: {length} chars, over the {limit}-char limit for earlier turns. "
        "Call the tool again if you need it.]"
    )


def stub(text: str, name: str, keep: int, lod: Lod) -> str:
    """Keep `keep` characters at the end(s) the tool declared; say how long the full text was."""
    keep = max(keep, MIN_STUB_KEEP)
    if len(text) <= keep:
        return text
    marker = f"[truncated: `{name}` result of {len(text)} chars; call the tool again for the full text]"
    if lod == "tail":
        return f"{marker}\n…{text[-keep:]}"
    if lod == "both":
        half = keep // 2
        return f"{marker}\n{text[:half]}\n…[{len(text) - 2 * half} chars elided]…\n{text[-half:]}"
    return f"{marker}\n{text[:keep]}…"


def shown_result(call: HistoryCall, mode: Mode, limits: Limits, lod: Lod) -> str:
    text = tool_text(call)
    if mode.previous_turn and len(text) > limits.hide_above:
        return hidden_note(call.name, len(text), limits.hide_above)
    if mode.lod and len(text) > limits.lod_above:
        text = stub(text, call.name, limits.lod_above // 2, lod)
    elif mode.cap and len(text) > limits.cap:
        text = stub(text, call.name, limits.cap, lod)
    return text if limits.verbatim else neutralise(text)


def render_row(row: HistoryRow, mode: Mode, limits: Limits, lods: dict[str, Lod]) -> RenderedRow:
    """One row -> its messages: user text, or assistant text with its calls and one result each."""
    if row.role != "assistant":
        # User rows, gateway notices (synthetic) and stored system notes all reach the model as user text.
        if mode.images and row.images and limits.image_part is not None:
            return _with_images(row, limits.image_part)
        messages: tuple[Message, ...] = ({"role": "user", "content": row.content},) if row.content else ()
    elif not row.calls:
        messages = ({"role": "assistant", "content": row.content},) if row.content else ()
    else:
        messages = _exchange(row, mode, limits, lods)
    return RenderedRow(messages, sum(message_chars(m) for m in messages))


def _exchange(row: HistoryRow, mode: Mode, limits: Limits, lods: dict[str, Lod]) -> tuple[Message, ...]:
    calls = [
        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or "{}"}}
        for c in row.calls
    ]
    # Several servers refuse `content: null` here (a 500 and a validation dump); "" is accepted
    # everywhere we know of, and `llm.tool_call_content: null` restores null for the others.
    content = row.content or (None if limits.null_call_content else "")
    assistant: Message = {"role": "assistant", "content": content, "tool_calls": calls}
    if row.replay and not mode.previous_turn:  # what its API needs back in the turn's next rounds
        assistant[REPLAY_KEY] = row.replay
    results = [
        {"role": "tool", "tool_call_id": c.call_id, "content": shown_result(c, mode, limits, lods.get(c.name, "head"))}
        for c in row.calls
    ]
    return (assistant, *results)


def _with_images(row: HistoryRow, image_part: ImagePart) -> RenderedRow:
    """The row's text (which names every file and where it is saved) and an image_url part per
    image that can still be read; the estimate counts each image by its pixel size."""
    parts: list[Message] = [{"type": "text", "text": row.content}]
    chars = message_chars({"content": row.content})
    for record in row.images:
        made = image_part(record)
        if made is not None:
            parts.append(made[0])
            chars += made[1]
    if len(parts) == 1:
        return RenderedRow(({"role": "user", "content": row.content},), chars)
    return RenderedRow(({"role": "user", "content": parts},), chars)


def _parts(content: str | list[Message]) -> list[Message]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def merge_user(first: Message, second: Message) -> Message:
    """Consecutive user messages become one; with images, one list of parts (text parts joined)."""
    a, b = first["content"], second["content"]
    if isinstance(a, str) and isinstance(b, str):
        return {"role": "user", "content": f"{a}\n\n{b}"}
    merged = _parts(a)
    for part in _parts(b):
        if part.get("type") == "text" and merged and merged[-1].get("type") == "text":
            merged[-1] = {"type": "text", "text": f"{merged[-1]['text']}\n\n{part['text']}"}
        else:
            merged.append(part)
    return {"role": "user", "content": merged}


def merge_assistant(first: Message, second: Message) -> Message:
    """A plain assistant message and the next assistant message (strict templates refuse two in
    a row) read as one: the texts joined, the second's tool calls kept."""
    text = "\n\n".join(part for part in (first["content"], second.get("content")) if part)
    return {**second, "content": text}


def mergeable(previous: Message, message: Message) -> bool:
    """Strict chat templates make user and assistant alternate, a tool exchange standing on the
    assistant's side: consecutive user messages, and an assistant message after a plain one,
    are merged into one."""
    role = message["role"]
    if role != previous["role"]:
        return False
    return role == "user" or (role == "assistant" and not previous.get("tool_calls"))


def merged(previous: Message, message: Message) -> Message:
    return merge_user(previous, message) if message["role"] == "user" else merge_assistant(previous, message)


# What stands first when the history starts with the assistant (its start was folded into the
# summary, which is then the first message): strict templates want a user message right after the
# system message.
OPENING: Message = {"role": "user", "content": "(The earlier conversation is summarised above.)"}
SUMMARY_HEADER = "[Summary of the earlier conversation, which is no longer shown]"


# ---- the blocks around the history ----------------------------------------------------------
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


def system_block(system_prompt: str) -> Message:
    """The static prompt (and the session's memory, fitting.py): the one part of the request
    that never changes within a session, so a provider's prefix cache holds it from the first
    request on. What does change goes after it: a fold's summary in the history (at the fold
    point), the scratchpad and the clock in the tail."""
    return {"role": "system", "content": system_prompt.strip() or DEFAULT_SYSTEM_PROMPT}


def summary_message(summary: str | None) -> Message | None:
    """A fold's summary, standing where the folded rows stood: the first message of the
    history (a user message, merged with the next one when that is a user message too)."""
    if not summary:
        return None
    return {"role": "user", "content": f"{SUMMARY_HEADER}\n{summary.strip()}"}


def notes_text(notes: dict[str, str]) -> str:
    """The scratchpad, sorted by key; said in the tail, where a note taken mid-turn changes
    nothing before it."""
    if not notes:
        return ""
    lines = "\n".join(f"- {key}: {value}" for key, value in sorted(notes.items()))
    return f"Scratchpad (your notes for this conversation):\n{lines}"


def tail_block(
    now: datetime, timezone: str, workspace: str, reminder: str | None, notes: dict[str, str] | None = None
) -> Message:
    """The part that changes every round goes last, where it cannot break the cached prefix:
    the clock, the working directory, the scratchpad, then the turn's reminder."""
    try:
        zone = ZoneInfo(timezone)
        zone_name = timezone
    except (ZoneInfoNotFoundError, ValueError):
        zone, zone_name = ZoneInfo("UTC"), f"UTC (agent.timezone {timezone!r} is unknown)"
    local = now.astimezone(zone)
    lines = [
        f"[context] Current date and time: {local:%A %Y-%m-%d %H:%M} ({zone_name}, UTC{local:%z}).",
        f"Working directory: {workspace}",
    ]
    if scratchpad := notes_text(notes or {}):
        lines.append(scratchpad)
    if reminder:
        lines.append(reminder.strip())
    return {"role": "user", "content": "\n".join(lines)}
