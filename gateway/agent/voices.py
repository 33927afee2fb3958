"""Whose words a turn holds besides its requester's: the rule that rights belong to people, not
to turns (docs/security.md, "Several people in one conversation").

A turn runs for the person whose message started it. Another person's message sent meanwhile
does not join it (gateway/inbox/running.py: it waits and runs as their own turn); but other
people's words can still be part of the turn's input: the group's chatter kept for it, a
message it replies to or quotes, a Slack thread's messages from before the mention. Each of
those is a voice. A tool call in a turn with voices is allowed only what every one of them may
use, no standing grant of the requester covers it (it is asked again), and the prompt and the
audit name them.

The voices of a user row are stored with it (`messages.voices`), so a turn resumed after a
park or a restart finds them again; rows are never trusted to say less than they hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.store import InboxItem, MessageRecord

How = Literal["chatter", "quote", "thread", "message"]
HOW_SAID = {
    "chatter": "said in the chat",
    "quote": "quoted",
    "thread": "earlier in the thread",
    "message": "a message of theirs",
}
DELEGATED = "delegate"  # the sender of a sub-agent's task row: its parent's words, held by its parent
UNKNOWN = "?"  # an author nobody knows (a channel's post): the channel's default role


@dataclass(frozen=True)
class Voice:
    id: str  # their platform id in the thread's channel; "" when unknown
    name: str
    how: How

    def as_json(self) -> dict[str, str]:
        return {"id": self.id, "name": self.name, "how": self.how}

    @classmethod
    def of(cls, data: dict[str, Any]) -> Voice:
        how = str(data.get("how") or "message")
        return cls(str(data.get("id") or ""), str(data.get("name") or ""), how if how in HOW_SAID else "message")  # type: ignore[arg-type]

    @property
    def rights_of(self) -> str:
        """The user id whose role limits the turn (unknown authors get the channel's default role)."""
        return self.id or UNKNOWN


def quoted_voices(payload: dict[str, Any]) -> list[dict[str, str]]:
    """The authors of what a message replies to or quotes (not the agent's own messages, not
    the sender themselves), as stored with its row."""
    sender = str((payload.get("sender") or {}).get("id") or "")
    found = []
    for quoted in payload.get("context") or ():
        if not isinstance(quoted, dict) or quoted.get("from_bot"):
            continue
        who_id = str(quoted.get("who_id") or "")
        if who_id and who_id == sender:
            continue
        how: How = "thread" if quoted.get("relation") == "thread" else "quote"
        found.append(Voice(who_id, str(quoted.get("who") or ""), how).as_json())
    return found


def chatter_voices(chatter: Iterable[InboxItem], sender_id: str) -> list[dict[str, str]]:
    """The authors of the group's chatter folded into a turn, but for its sender."""
    found = []
    for item in chatter:
        person = item.payload.get("sender") or {}
        who_id = str(person.get("id") or "")
        if who_id != sender_id:
            name = str(person.get("name") or person.get("username") or who_id)
            found.append(Voice(who_id, name, "chatter").as_json())
    return found


def with_voices(payload: dict[str, Any], voices: Sequence[dict[str, str]]) -> dict[str, Any]:
    if not voices:
        return payload
    return {**payload, "voices": _unique([*(payload.get("voices") or ()), *voices])}


def of_rows(rows: Iterable[MessageRecord], requester: str) -> tuple[Voice, ...]:
    """The voices of a turn's user rows: their stored voices, and the row itself when someone
    other than the requester sent it (a row from before messages kept their authors apart)."""
    found: list[dict[str, str]] = []
    for row in rows:
        if row.role != "user" or row.synthetic:
            continue
        if row.sender_id and str(row.sender_id) not in (str(requester), DELEGATED):
            found.append(Voice(str(row.sender_id), row.sender_name or "", "message").as_json())
        found.extend(row.voices or ())
    return others(found, requester)


def others(voices: Iterable[dict[str, str]], requester: str) -> tuple[Voice, ...]:
    """Distinct voices that are not the requester's own."""
    return tuple(Voice.of(v) for v in _unique(voices) if not v.get("id") or str(v["id"]) != str(requester))


def denial_text(tool: str, voice: Voice, role: str) -> str:
    """The tool result when someone else's words in the turn may not lead to the tool."""
    who = voice.name or "someone"
    return (
        f"Tool call denied: {tool!r} is not run, because this request holds words of {who} "
        f"({HOW_SAID[voice.how]}), whose role {role!r} may not use it. Only what everyone whose words "
        "led to a call may use is run; the person who asked can ask again in their own words."
    )


def described(voices: Sequence[Voice]) -> str:
    """ "Mel (said in the chat), Bob (quoted)" """
    return ", ".join(f"{v.name or 'someone'} ({HOW_SAID[v.how]})" for v in voices)


def _unique(voices: Iterable[dict[str, str]]) -> list[dict[str, str]]:
    seen: set[tuple[str, str]] = set()
    kept = []
    for voice in voices:
        key = (str(voice.get("id") or ""), str(voice.get("name") or "") if not voice.get("id") else "")
        if key not in seen:
            seen.add(key)
            kept.append(dict(voice))
    return kept
