"""Outbound messages recorded before and after they are sent (idempotency by key)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.engine import Connection

from gateway.store.base import Repo, to_record, utcnow
from gateway.store.inbox import InsertIgnoring
from gateway.store.records import OutboxRecord, RunEnd
from gateway.store.runs import RunRepo
from gateway.store.tables import outbox

_RECORD = InsertIgnoring(outbox, ["key"], returning=tuple(outbox.c))
_BY_KEY = select(outbox).where(outbox.c.key == bindparam("outbox_key"))
_MARK_SENT = update(outbox).where(outbox.c.id == bindparam("record_id")).values(attempts=outbox.c.attempts + 1)


class OutboxRepo(Repo):
    async def record(self, key: str, thread_key: str, kind: str, payload: dict[str, Any]) -> OutboxRecord:
        """Record an intent to send; returns the existing record when the key is known."""
        return await self.db.write(lambda conn: self.record_in(conn, key, thread_key, kind, payload))

    @staticmethod
    def record_in(conn: Connection, key: str, thread_key: str, kind: str, payload: dict[str, Any]) -> OutboxRecord:
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
            },
        ).first()
        if row is None:  # the key was recorded before: what happened to it then
            row = conn.execute(_BY_KEY, {"outbox_key": key}).first()
        return to_record(OutboxRecord, row)

    async def get(self, key: str) -> OutboxRecord | None:
        def work(conn: Connection) -> OutboxRecord | None:
            row = conn.execute(_BY_KEY, {"outbox_key": key}).first()
            return to_record(OutboxRecord, row) if row else None

        return await self.db.read(work)

    async def mark_sent(self, record_id: int, message_ids: Sequence[str], *, run_end: RunEnd | None = None) -> None:
        """Mark delivered; with `run_end`, the run it finishes is finished in the same write."""

        def work(conn: Connection) -> None:
            self.mark_sent_in(conn, record_id, message_ids)
            if run_end is not None:
                RunRepo.set_stage_in(conn, run_end.run_id, run_end.stage, end_reason=run_end.end_reason)

        await self.db.write(work)

    @staticmethod
    def mark_sent_in(conn: Connection, record_id: int, message_ids: Sequence[str]) -> None:
        conn.execute(
            _MARK_SENT,
            {"record_id": record_id, "status": "sent", "message_ids": list(message_ids), "sent_at": utcnow()},
        )

    async def set_message_ids(self, record_id: int, message_ids: Sequence[str]) -> None:
        """Progress of a stream: the messages it has created so far (a resumed turn edits them)."""
        await self.db.write(
            lambda conn: conn.execute(
                update(outbox).where(outbox.c.id == record_id).values(message_ids=list(message_ids))
            )
        )

    async def mark_failed(self, record_id: int, error: str, *, final: bool) -> None:
        await self.db.write(
            lambda conn: conn.execute(
                update(outbox)
                .where(outbox.c.id == record_id)
                .values(status="failed" if final else "pending", error=error[:2000], attempts=outbox.c.attempts + 1)
            )
        )

    async def pending(self, limit: int = 100) -> list[OutboxRecord]:
        def work(conn: Connection) -> list[OutboxRecord]:
            rows = conn.execute(
                select(outbox).where(outbox.c.status == "pending").order_by(outbox.c.id).limit(limit)
            ).all()
            return [to_record(OutboxRecord, r) for r in rows]

        return await self.db.read(work)
