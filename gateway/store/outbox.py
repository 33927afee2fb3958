"""Outbound messages recorded before and after they are sent (idempotency by key)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, or_, select, update
from sqlalchemy.engine import Connection

from gateway.events import utcnow
from gateway.store.base import Fence, Repo, check_fence, to_record
from gateway.store.inbox import InsertIgnoring
from gateway.store.records import FinalStage, OutboxRecord
from gateway.store.runs import RunRepo
from gateway.store.tables import outbox

# Kinds that are deliveries (a "partial" row only remembers a stream's messages).
SENDABLE = ("message", "prompt", "close_prompt")
_RECORD = InsertIgnoring(outbox, ["key"], returning=tuple(outbox.c))
_BY_KEY = select(outbox).where(outbox.c.key == bindparam("outbox_key"))
_MARK_SENT = update(outbox).where(outbox.c.id == bindparam("record_id")).values(attempts=outbox.c.attempts + 1)


_REMEMBER_PARTIAL = update(outbox).where(outbox.c.id == bindparam("record_id")).values(status="pending")
_FORGET_PARTIAL = update(outbox).where(outbox.c.id == bindparam("record_id")).values(status="sent", message_ids=[])
# Its messages (and an uncertain send among them) are now another row's: listed there, once.
_HAND_OVER_PARTIAL = _FORGET_PARTIAL.values(uncertain=None)


class OutboxRepo(Repo):
    """Every write of a send takes the fence of the lease its sender works under (None: no
    lease, as for a startup notice): once another instance took the thread over, the write
    raises LeaseLost and changes nothing."""

    async def record(
        self, key: str, thread_key: str, kind: str, payload: dict[str, Any], *, fence: Fence | None = None
    ) -> OutboxRecord:
        """Record an intent to send; returns the existing record when the key is known."""

        def work(conn: Connection) -> OutboxRecord:
            check_fence(conn, fence)
            return self.record_in(conn, key, thread_key, kind, payload, fence=fence)

        return await self.db.write(work)

    @staticmethod
    def record_in(
        conn: Connection, key: str, thread_key: str, kind: str, payload: dict[str, Any], *, fence: Fence | None = None
    ) -> OutboxRecord:
        row = conn.execute(
            _RECORD.for_conn(conn),
            {
                "key": key,
                "thread_key": thread_key,
                "kind": kind,
                "payload": payload,
                "status": "pending",
                "message_ids": [],
                "attempts": 0,
                "created_at": utcnow(),
                "sender_lease": fence.name if fence is not None else None,
                "sender_fence": fence.token if fence is not None else None,
            },
        ).first()
        if row is None:  # the key was recorded before: what happened to it then
            row = conn.execute(_BY_KEY, {"outbox_key": key}).first()
        return to_record(OutboxRecord, row)

    async def note_uncertain(self, key: str, thread_key: str, kind: str, note: str, message_ids: Sequence[str]) -> None:
        """What may be in the chat without the row saying so: a sender that lost its thread
        while stalled (its send timed out, `message_ids` unknown, or a stream it opened was never
        recorded), or one that died before recording its attempt (the sweeper's note). Not fenced,
        on purpose: it changes no delivery (the status stays as the new holder left it), it only
        records the ambiguity, so `gateway outbox` lists the row and an answer seen twice is
        explained by it."""

        def work(conn: Connection) -> None:
            row = self.record_in(conn, key, thread_key, kind, {})
            values: dict[str, Any] = {"uncertain": row.uncertain or note[:255]}
            if message_ids and not row.message_ids:
                values["message_ids"] = list(message_ids)
            conn.execute(update(outbox).where(outbox.c.id == row.id).values(**values))

        await self.db.write(work)

    async def get(self, key: str) -> OutboxRecord | None:
        def work(conn: Connection) -> OutboxRecord | None:
            row = conn.execute(_BY_KEY, {"outbox_key": key}).first()
            return to_record(OutboxRecord, row) if row else None

        return await self.db.read(work)

    async def mark_sent(
        self,
        record_id: int,
        message_ids: Sequence[str],
        *,
        final_stage: FinalStage | None = None,
        forget: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        """Mark delivered; with `final_stage`, the run it finishes is finished in the same write;
        `forget`: a stream's partial record that this delivery completes."""

        def work(conn: Connection) -> None:
            check_fence(conn, fence)
            self.mark_sent_in(conn, record_id, message_ids)
            if forget is not None:
                conn.execute(_HAND_OVER_PARTIAL, {"record_id": forget})
            if final_stage is not None:
                RunRepo.set_stage_in(conn, final_stage.run_id, final_stage.stage, end_reason=final_stage.end_reason)

        await self.db.write(work)

    @staticmethod
    def mark_sent_in(conn: Connection, record_id: int, message_ids: Sequence[str]) -> None:
        conn.execute(
            _MARK_SENT,
            {"record_id": record_id, "status": "sent", "message_ids": list(message_ids), "sent_at": utcnow()},
        )

    async def remember_partial(self, record_id: int, message_ids: Sequence[str], *, fence: Fence | None = None) -> None:
        """The messages a stream shows so far (a continued turn adopts them)."""

        def work(conn: Connection) -> None:
            check_fence(conn, fence)
            conn.execute(_REMEMBER_PARTIAL, {"record_id": record_id, "message_ids": list(message_ids)})

        await self.db.write(work)

    async def adopt_partial(
        self, from_key: str, to_key: str, thread_key: str, *, fence: Fence | None = None, orphaned: str = ""
    ) -> OutboxRecord | None:
        """What an interrupted stream (`from_key`) was showing becomes the continuing stream's
        (`to_key`), in one write: its messages and whether one of them timed out (an uncertain
        send). A stream stopped while posting its first message (the intent recorded, no
        message id) may have left it in the chat: adopted as uncertain, saying `orphaned`. None
        when it showed nothing (or was delivered or adopted already)."""

        def work(conn: Connection) -> OutboxRecord | None:
            check_fence(conn, fence)
            old = conn.execute(_BY_KEY, {"outbox_key": from_key}).first()
            if old is None or old.status != "pending":
                return None
            uncertain = old.uncertain
            if not old.message_ids and uncertain is None:
                if not (orphaned and isinstance(old.payload, dict) and old.payload.get("posting")):
                    return None
                uncertain = orphaned[:255]
            mine = self.record_in(conn, to_key, thread_key, "partial", old.payload)
            conn.execute(
                update(outbox)
                .where(outbox.c.id == mine.id)
                .values(status="pending", message_ids=old.message_ids, uncertain=uncertain, error=old.error)
            )
            conn.execute(_HAND_OVER_PARTIAL, {"record_id": old.id})
            return replace(to_record(OutboxRecord, old), uncertain=uncertain)

        return await self.db.write(work)

    async def forget_partial(self, record_id: int, *, fence: Fence | None = None) -> None:
        def work(conn: Connection) -> None:
            check_fence(conn, fence)
            conn.execute(_FORGET_PARTIAL, {"record_id": record_id})

        await self.db.write(work)

    async def attempt_failed(
        self,
        record_id: int,
        error: str,
        *,
        final: bool,
        retry_at: datetime | None = None,
        uncertain: str | None = None,
        delivered: Sequence[str] = (),
        payload: dict[str, Any] | None = None,
        fence: Fence | None = None,
    ) -> None:
        """One attempt failed: the error, when the platform allows the next one, what was
        decided after an ambiguous failure, the parts already posted (kept as progress), and
        (`payload`) what a stream's progress record was showing when it failed."""
        values: dict[str, Any] = {
            "status": "failed" if final else "pending",
            "error": error[:2000],
            "attempts": outbox.c.attempts + 1,
            "retry_at": retry_at,
        }
        if uncertain is not None:
            values["uncertain"] = uncertain[:255]
        if delivered:
            values["message_ids"] = list(delivered)
        if payload is not None:
            values["payload"] = payload

        def work(conn: Connection) -> None:
            check_fence(conn, fence)
            conn.execute(update(outbox).where(outbox.c.id == record_id).values(**values))

        await self.db.write(work)

    async def left_behind(self, thread_key: str, fence: Fence, *, limit: int = 20) -> list[OutboxRecord]:
        """Sends into the thread that an earlier holder of its lease (`fence`) recorded and left
        pending (stopped or killed while a send waited out a flood wait, or mid-send), oldest
        first. Rows recorded under other leases (another thread's approval card or job delivery
        into the same chat) are their own senders' business."""

        return await self.db.read(
            lambda conn: _pending(
                conn,
                outbox.c.thread_key == thread_key,
                outbox.c.sender_lease == fence.name,
                outbox.c.sender_fence < fence.token,
                limit=limit,
            )
        )

    async def undelivered(self, thread_key: str | None = None, *, limit: int = 100) -> list[OutboxRecord]:
        """Sends not done yet (waiting for the platform, being retried or stuck), oldest first."""

        where = [outbox.c.thread_key == thread_key] if thread_key is not None else []
        return await self.db.read(lambda conn: _pending(conn, *where, limit=limit))

    async def stuck(self, age: timedelta, *, limit: int = 50) -> list[OutboxRecord]:
        """Sends pending for longer than `age` and not waiting for a retry_after nor retried
        within `age`: nobody is sending them (the sweeper's work), oldest first."""
        cutoff = utcnow() - age

        return await self.db.read(
            lambda conn: _pending(
                conn,
                outbox.c.created_at < cutoff,
                or_(outbox.c.retry_at.is_(None), outbox.c.retry_at < cutoff),
                limit=limit,
            )
        )

    async def uncertain(self, *, limit: int = 100) -> list[OutboxRecord]:
        """Sends that failed ambiguously (they may have been delivered), newest first."""

        def work(conn: Connection) -> list[OutboxRecord]:
            rows = conn.execute(
                select(outbox).where(outbox.c.uncertain.is_not(None)).order_by(outbox.c.id.desc()).limit(limit)
            ).all()
            return [to_record(OutboxRecord, r) for r in rows]

        return await self.db.read(work)


def _pending(conn: Connection, *where: Any, limit: int) -> list[OutboxRecord]:
    """Sendable rows still pending that also meet `where`, oldest first."""
    query = select(outbox).where(outbox.c.status == "pending", outbox.c.kind.in_(SENDABLE), *where)
    return [to_record(OutboxRecord, r) for r in conn.execute(query.order_by(outbox.c.id).limit(limit)).all()]
