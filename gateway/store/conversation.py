"""The conversation as the platforms revise it: edits, deletions, reactions, and group chatter
kept as context. Each is an inbox row unique on its platform event id (a redelivery is a
no-op), applied in the transaction that records it.

Item kinds written here: `edit` (pending: an answered message's edit, handled by the thread's
worker; done: applied to a queued message, or ignored), `delete` and `reaction` (done: the
record), `ambient` (status `context` until an addressed message takes it in).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlalchemy import Row, and_, or_, select, update
from sqlalchemy.engine import Connection

from gateway.events import utcnow
from gateway.store.base import Repo, to_record
from gateway.store.inbox import InboxRepo, NewItem
from gateway.store.records import InboxItem
from gateway.store.runs import RunRepo
from gateway.store.tables import inbox, messages, outbox

DELETED_TEXT = "[this message was deleted by its author]"
# The items a platform message id can name: what a person said, or group chatter kept.
_SAID = ("message", "command", "ambient")
_LOOK_BACK = 500  # rows of a chat searched for the message an edit, deletion or reaction names

EditOutcome = Literal["duplicate", "replaced", "follow-up", "ignored", "new", "context"]
DeleteOutcome = Literal["duplicate", "dropped", "redacted", "unknown"]


def chat_range(channel: str, chat: str) -> tuple[str, str]:
    """Thread keys of one chat (any topic or thread) as an index range: `channel:chat:` up to
    the next character after the separator."""
    prefix = f"{channel}:{chat}:"
    return prefix, prefix[:-1] + chr(ord(":") + 1)


@dataclass(frozen=True)
class Feedback:
    run_id: int | None  # the run whose reply was reacted to; None: not one of the agent's replies
    duplicate: bool = False


def _in_chat(conn: Connection, table: Any, channel: str, chat: str, *where: Any) -> list[Row]:
    low, high = chat_range(channel, chat)
    query = select(table).where(table.c.thread_key >= low, table.c.thread_key < high, *where)
    return list(conn.execute(query.order_by(table.c.id.desc()).limit(_LOOK_BACK)).all())


def _said_in(conn: Connection, channel: str, chat: str, message_id: str, kinds: Sequence[str] = _SAID) -> Row | None:
    rows = _in_chat(conn, inbox, channel, chat, inbox.c.kind.in_(list(kinds)))
    return next((r for r in rows if str(r.payload.get("message_id") or "") == message_id), None)


def _add(conn: Connection, item: NewItem) -> int | None:
    """The new row's id, or None for a duplicate. Rows that are not pending get their time of
    handling now: retention prunes them by it."""
    if not InboxRepo.add_in(conn, item):
        return None
    row_id = conn.execute(select(inbox.c.id).where(inbox.c.event_id == item.event_id)).scalar_one()
    if item.status != "pending":
        conn.execute(update(inbox).where(inbox.c.id == row_id).values(done_at=utcnow()))
    return int(row_id)


def _set(conn: Connection, row_id: int, **values: Any) -> None:
    conn.execute(update(inbox).where(inbox.c.id == row_id).values(**values))


class ConversationRepo(Repo):
    async def edit(
        self, item: NewItem, channel: str, chat: str, message_id: str, *, is_command: bool, keep: int
    ) -> EditOutcome:
        """Apply an edit of message `message_id` (`item.payload` is the new message): a queued
        original (or kept chatter) takes the new text and stays one message; an answered one gets
        a pending `edit` item (one per message: a later edit replaces its text); a command, or
        an edit into one, is never replayed; a message never seen becomes a new one."""

        def work(conn: Connection) -> EditOutcome:
            if conn.execute(select(inbox.c.id).where(inbox.c.event_id == item.event_id)).first() is not None:
                return "duplicate"
            original = _said_in(conn, channel, chat, message_id)
            if original is None:
                kind, status = ("ambient", "context") if keep else ("command" if is_command else "message", "pending")
                _add(conn, NewItem(item.event_id, item.thread_key, kind, item.payload, status))
                return "context" if keep else "new"
            record = {**item.payload, "edit_of_item": original.id}
            # A command is never replayed; an answered message edited into chatter is not answered.
            unaddressed = bool(keep) and original.kind != "ambient"
            if original.kind == "command" or is_command or original.status == "dropped" or unaddressed:
                _add(conn, NewItem(item.event_id, item.thread_key, "edit", {**record, "ignored": True}, "done"))
                return "ignored"
            if original.status in ("pending", "held", "context"):
                revised = {**original.payload, "text": item.payload.get("text", ""), "edited": True}
                _set(conn, original.id, payload=revised)
                _add(conn, NewItem(item.event_id, item.thread_key, "edit", {**record, "applied": True}, "done"))
                return "replaced"
            waiting = _said_in(conn, channel, chat, message_id, kinds=("edit",))
            if waiting is not None and waiting.status in ("pending", "note"):
                _set(conn, waiting.id, payload={**waiting.payload, "text": item.payload.get("text", "")})
                _add(
                    conn, NewItem(item.event_id, item.thread_key, "edit", {**record, "merged_into": waiting.id}, "done")
                )
                return "replaced"
            before = str(original.payload.get("text") or "")
            _add(conn, NewItem(item.event_id, original.thread_key, "edit", {**record, "edited_from": before}))
            return "follow-up"

        return await self.db.write(work)

    async def delete(self, item: NewItem, channel: str, chat: str, message_id: str) -> DeleteOutcome:
        """A queued message (or kept chatter) is dropped; an answered one's history row loses its
        text, so the model no longer sees it. Recorded either way."""

        def work(conn: Connection) -> DeleteOutcome:
            if _add(conn, item) is None:
                return "duplicate"
            original = _said_in(conn, channel, chat, message_id, kinds=(*_SAID, "edit"))
            if original is None:
                return "unknown"
            if original.status in ("pending", "held", "context", "note"):
                _set(
                    conn, original.id, status="dropped", done_at=utcnow(), payload={**original.payload, "deleted": True}
                )
                return "dropped"
            row = original.payload.get("history_row")
            if row is not None:
                conn.execute(
                    update(messages).where(messages.c.id == int(row)).values(content=DELETED_TEXT, images=None)
                )
            _set(conn, original.id, payload={**original.payload, "deleted": True})
            return "redacted"

        return await self.db.write(work)

    async def react(
        self, item: NewItem, channel: str, chat: str, message_id: str, feedback: dict[str, Any]
    ) -> Feedback:
        """A reaction on one of the agent's replies becomes a FEEDBACK event of the run that sent it."""

        def work(conn: Connection) -> Feedback:
            if _add(conn, item) is None:
                return Feedback(None, duplicate=True)
            run_id = _run_of_reply(conn, channel, chat, message_id)
            if run_id is not None:
                RunRepo.add_events_in(conn, run_id, [("FEEDBACK", feedback, None)])
            return Feedback(run_id)

        return await self.db.write(work)

    async def keep_context(self, item: NewItem, keep: int) -> bool:
        """Store unaddressed chatter; only the newest `keep` of its thread stay kept."""

        def work(conn: Connection) -> bool:
            if _add(conn, item) is None:
                return False
            kept = (
                conn.execute(
                    select(inbox.c.id)
                    .where(
                        inbox.c.thread_key == item.thread_key, inbox.c.kind == "ambient", inbox.c.status == "context"
                    )
                    .order_by(inbox.c.id.desc())
                )
                .scalars()
                .all()
            )
            old = list(kept[keep:])
            if old:
                conn.execute(update(inbox).where(inbox.c.id.in_(old)).values(status="done", done_at=utcnow()))
            return True

        return await self.db.write(work)

    async def kept(self, chatter_of: str, notes_of: str) -> tuple[list[InboxItem], list[InboxItem]]:
        """What leads a thread's next turn, oldest first, in one read: the chatter kept where the
        thread sits (`chatter_of`: its group or channel) and the edits of answered messages noted
        for the thread itself (`notes_of`)."""
        query = (
            select(inbox)
            .where(
                or_(
                    and_(inbox.c.thread_key == chatter_of, inbox.c.kind == "ambient", inbox.c.status == "context"),
                    and_(inbox.c.thread_key == notes_of, inbox.c.kind == "edit", inbox.c.status == "note"),
                )
            )
            .order_by(inbox.c.id)
        )
        rows = await self.db.read(lambda conn: [to_record(InboxItem, r) for r in conn.execute(query).all()])
        return [i for i in rows if i.kind == "ambient"], [i for i in rows if i.kind == "edit"]

    async def note(self, item_id: int) -> None:
        """An answered message's edit kept as context for the next turn (`inbox.on_edit: note`)."""
        await self.db.write(
            lambda conn: conn.execute(
                update(inbox)
                .where(inbox.c.id == item_id, inbox.c.status == "pending")
                .values(status="note", done_at=utcnow())
            )
        )


def _run_of_reply(conn: Connection, channel: str, chat: str, message_id: str) -> int | None:
    for row in _in_chat(conn, outbox, channel, chat):
        if message_id not in [str(m) for m in row.message_ids or ()]:
            continue
        kind, _, rest = str(row.key).partition(":")
        if kind == "reply" and rest.isdigit():
            run = conn.execute(select(messages.c.run_id).where(messages.c.id == int(rest))).scalar()
            return int(run) if run is not None else None
        if kind in ("end", "apology") and rest.isdigit():
            return int(rest)
        return None
    return None
