"""A message's surroundings put into words for the model: what it replies to (or quotes), the
thread's earlier messages when the agent joined late, the group's chatter since, an edit of an
answered message. Written into the user row's content only (the stored item keeps its own
text), each quote within a budget."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.agent.voices import quoted_voices, with_voices
from gateway.store import InboxItem

QUOTE_BUDGET = 500  # characters of one quoted message
CONTEXT_BUDGET = 4000  # characters of a thread's or a group's earlier messages, newest kept


def clip(text: str, budget: int = QUOTE_BUDGET) -> str:
    text = " ".join(text.split())
    return text if len(text) <= budget else text[: budget - 1].rstrip() + "…"


def _who(quoted: dict[str, Any]) -> str:
    if quoted.get("from_bot"):
        return "you (your own earlier message)"
    return str(quoted.get("who") or "someone")


def _name(payload: dict[str, Any]) -> str:
    sender = payload.get("sender") or {}
    return str(sender.get("name") or sender.get("username") or sender.get("id") or "someone")


def _lines(entries: Sequence[str]) -> list[str]:
    """The newest entries that fit the context budget, in order."""
    kept: list[str] = []
    total = 0
    for entry in reversed(entries):
        total += len(entry) + 1
        if total > CONTEXT_BUDGET:
            break
        kept.append(entry)
    return kept[::-1]


def quoted_lines(payload: dict[str, Any]) -> list[str]:
    quoted = [q for q in payload.get("context") or () if isinstance(q, dict)]
    lines = []
    for q in (q for q in quoted if q.get("relation", "reply") == "reply"):
        verb = "quoting from" if q.get("fragment") else "replying to"
        lines.append(f'[{verb} {_who(q)}: "{clip(str(q.get("text") or ""))}"]')
    thread = [f"{_who(q)}: {clip(str(q.get('text') or ''))}" for q in quoted if q.get("relation") == "thread"]
    if thread:
        lines.append("[earlier in this thread, before you were mentioned:\n" + "\n".join(_lines(thread)) + "]")
    if payload.get("edited_from") is not None:
        lines.append(
            "[an edit of an earlier message of theirs, which you already answered; it said: "
            f'"{clip(str(payload["edited_from"]))}". It now says:]'
        )
    return lines


def kept_lines(chatter: Sequence[InboxItem], notes: Sequence[InboxItem]) -> list[str]:
    lines = []
    said = [f"{_name(i.payload)}: {clip(str(i.payload.get('text') or ''))}" for i in chatter if i.payload.get("text")]
    if said:
        lines.append("[said in this chat since, not addressed to you:\n" + "\n".join(_lines(said)) + "]")
    for note in notes:
        lines.append(
            f"[{_name(note.payload)} edited a message you had already answered; it said: "
            f'"{clip(str(note.payload.get("edited_from") or ""))}", it now says: '
            f'"{clip(str(note.payload.get("text") or ""))}"]'
        )
    return lines


def led_by(payload: dict[str, Any], lines: Sequence[str]) -> dict[str, Any]:
    """A payload made ready (`with_context`) with more lines before what it says."""
    body = str(payload.get("content", payload.get("text", "")))
    return {**payload, "content": "\n".join([*lines, body])} if lines else payload


def with_context(payload: dict[str, Any], before: Sequence[str] = ()) -> dict[str, Any]:
    """The payload whose `content` (what the user row says) leads with its surroundings, and
    whose `voices` name the other people whose words those are."""
    payload = with_voices(payload, quoted_voices(payload))
    lines = [*before, *quoted_lines(payload)]
    body = str(payload.get("content", payload.get("text", "")))
    if payload.get("edited_from") is not None:
        body = f"(edited) {body}"
    elif not lines:
        return payload
    return {**payload, "content": "\n".join([*lines, body])}
