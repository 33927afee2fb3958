"""What a conversation has held besides its people's typed words, read from what it stored:
the tools whose results it read, who wrote its user rows, the inbox items it took in (their
senders, attachments, quotes and kept chatter). gateway/memory/provenance.py judges it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.engine import Connection

from gateway.store.db import Database
from gateway.store.tables import inbox, messages, sessions, tool_calls

# The inbox items that become words of a conversation (a message, kept chatter, an edit, a
# background task's report); buttons, commands and resumes add none.
SAID_KINDS = ("message", "ambient", "edit", "report")
# Opens a job's check output inside the message that starts its run (scheduler/checks.py): what
# follows is tool output, whoever the message is from.
CHECK_OUTPUT_OPEN = "<check-output>"


@dataclass(frozen=True)
class SaidItem:
    """One inbox item a conversation took in, as far as where its words came from goes."""

    kind: str
    sender: str
    attachments: tuple[str, ...]  # the kinds the platform gave: photo, document, voice, ...
    quotes: int  # quoted or earlier messages that are not the agent's own
    checked: bool = False  # it carries a job's check output (tool output)


@dataclass(frozen=True)
class Evidence:
    tools: frozenset[str]  # the tools whose results came back (done or failed)
    senders: frozenset[str]  # who wrote the user rows ("" for none)
    images: bool  # a user row carried an image
    items: tuple[SaidItem, ...]
    began: datetime | None  # its first row


async def conversation_evidence(db: Database, session_id: int) -> Evidence:
    def work(conn: Connection) -> Evidence:
        ran = select(tool_calls.c.name).where(
            tool_calls.c.session_id == session_id, tool_calls.c.status.in_(("done", "failed"))
        ).distinct()
        users = select(messages.c.sender_id, func.count(messages.c.images)).where(
            messages.c.session_id == session_id, messages.c.role == "user"
        ).group_by(messages.c.sender_id)
        senders = conn.execute(users).all()
        began = conn.execute(select(func.min(messages.c.created_at)).where(messages.c.session_id == session_id))
        key = conn.execute(select(sessions.c.thread_key).where(sessions.c.id == session_id)).scalar() or ""
        channel, chat, _ = (key.split(":", 2) + ["", ""])[:3]
        # Its thread's items, and the chatter kept at the chat's level (a topic's or a Slack thread's
        # surroundings): looked up by thread key, which is indexed.
        where = {key, f"{channel}:{chat}:"}
        said = select(inbox.c.kind, inbox.c.payload).where(
            inbox.c.thread_key.in_(sorted(where)), inbox.c.session_id == session_id, inbox.c.kind.in_(SAID_KINDS)
        )
        return Evidence(
            tools=frozenset(str(n) for n in conn.execute(ran).scalars()),
            senders=frozenset(str(r[0] or "") for r in senders),
            images=any(r[1] for r in senders),
            items=tuple(_said(kind, payload) for kind, payload in conn.execute(said).all()),
            began=_aware(began.scalar()),
        )

    return await db.read(work, large=True)


def _said(kind: str, payload: Any) -> SaidItem:
    payload = payload if isinstance(payload, dict) else {}
    sender = payload.get("sender") or {}
    attachments = tuple(str((a or {}).get("kind") or "file") for a in payload.get("attachments") or ())
    quotes = sum(1 for q in payload.get("context") or () if isinstance(q, dict) and not q.get("from_bot"))
    checked = CHECK_OUTPUT_OPEN in str(payload.get("text") or "")
    who = str(sender.get("id") or "") if isinstance(sender, dict) else str(sender)
    return SaidItem(kind, who, attachments, quotes, checked)


def _aware(value: Any) -> datetime | None:
    """min() of a UTCDateTime column comes back without its type's processing on SQLite."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
