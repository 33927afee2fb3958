"""Built-ins that touch nothing outside the session: the clock and the scratchpad.

The scratchpad changes only the session's own notes and setting a note twice is harmless,
so it is declared without side effects (no approval by default, safe to re-run).
"""

from __future__ import annotations

import re
from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gateway.tools.registry import ToolContext, ToolError, ToolSpec, build_spec

MAX_KEY_CHARS = 64
MAX_VALUE_CHARS = 2_000
MAX_NOTES = 32
_KEY = re.compile(r"^[\w .:-]+$")


async def clock(ctx: ToolContext) -> str:
    """The current date and time (ISO 8601 with the UTC offset) and weekday in the configured timezone."""
    try:
        zone = ZoneInfo(ctx.agent.timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"agent.timezone {ctx.agent.timezone!r} is not a known IANA timezone") from None
    now = datetime.now(zone)
    return f"{now.isoformat(timespec='seconds')} {now:%A} ({ctx.agent.timezone})"


async def scratchpad_set(ctx: ToolContext, key: str, value: str) -> str:
    """Save a short note for this conversation; notes are shown to you at the start of every turn.

    Args:
        key: a short name for the note (letters, digits, spaces, _ . : -)
        value: the note's text; an empty value removes the note
    """
    key = _checked_key(key)
    notes = await ctx.notes.get_notes(ctx.session_id)
    if value == "":
        if key not in notes:
            return f"No note named {key!r}; nothing removed."
        await ctx.notes.set_note(ctx.session_id, key, None)
        return f"Removed note {key!r}."
    if len(value) > MAX_VALUE_CHARS:
        raise ToolError(f"value is {len(value)} chars; notes are limited to {MAX_VALUE_CHARS}. Shorten it.")
    if key not in notes and len(notes) >= MAX_NOTES:
        raise ToolError(f"there are already {MAX_NOTES} notes; remove one (empty value) before adding another")
    await ctx.notes.set_note(ctx.session_id, key, value)
    return f"Saved note {key!r}."


async def scratchpad_get(ctx: ToolContext, key: str | None = None) -> str:
    """Read one note by key, or all notes when no key is given.

    Args:
        key: the note to read; omit it to list every note
    """
    notes = await ctx.notes.get_notes(ctx.session_id)
    if key is None:
        if not notes:
            return "The scratchpad is empty."
        return "\n".join(f"{name}: {text}" for name, text in sorted(notes.items()))
    if key in notes:
        return notes[key]
    existing = ", ".join(sorted(notes)) or "none"
    return f"No note named {key!r}. Existing notes: {existing}."


def _checked_key(key: str) -> str:
    key = key.strip()
    if not key or len(key) > MAX_KEY_CHARS or not _KEY.match(key):
        raise ToolError(
            f"key must be 1-{MAX_KEY_CHARS} characters of letters, digits, spaces, _ . : - (got {key!r})"
        )
    return key


def basic_specs() -> list[ToolSpec]:
    return [
        build_spec(clock),
        build_spec(scratchpad_set, classes={"memory"}),
        build_spec(scratchpad_get, classes={"memory"}),
    ]
