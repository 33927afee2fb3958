"""Outbound messages recorded before and after they are sent (idempotency by key)."""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import select, update

from gateway.store.base import Repo, to_record, utcnow
from gateway.store.inbox import insert_ignoring
from gateway.store.records import OutboxRecord
from gateway.store.tables import outbox


class OutboxRepo(Repo):
    async def record(self, key: str, thread_key: str, kind: str, payload: dict[str, Any]) -> OutboxRecord:
        """Record an intent to send; returns the existing record when the key is known."""
        async with self.db.write() as conn:
            row = (
                await conn.execute(
                    insert_ignoring(conn, outbox, ["key"])
                    .values(key=key, thread_key=thread_key, kind=kind, payload=payload, status="pending", message_ids=[], attempts=0, created_at=utcnow())
                    .returning(*outbox.c)
                )
            ).first()
            if row is None:  # the key was recorded before: what happened to it then
                row = (await conn.execute(select(outbox).where(outbox.c.key == key))).first()
        return to_record(OutboxRecord, row)

    async def get(self, key: str) -> OutboxRecord | None:
        async with self.db.read() as conn:
            row = (await conn.execute(select(outbox).where(outbox.c.key == key))).first()
        return to_record(OutboxRecord, row) if row else None

    async def mark_sent(self, record_id: int, message_ids: Sequence[str]) -> None:
        async with self.db.write() as conn:
            await conn.execute(
                update(outbox).where(outbox.c.id == record_id).values(status="sent", message_ids=list(message_ids), sent_at=utcnow(), attempts=outbox.c.attempts + 1)
            )

    async def set_message_ids(self, record_id: int, message_ids: Sequence[str]) -> None:
        """Progress of a stream: the messages it has created so far (a resumed turn edits them)."""
        async with self.db.write() as conn:
            await conn.execute(update(outbox).where(outbox.c.id == record_id).values(message_ids=list(message_ids)))

    async def mark_failed(self, record_id: int, error: str, *, final: bool) -> None:
        async with self.db.write() as conn:
            await conn.execute(
                update(outbox)
                .where(outbox.c.id == record_id)
                .values(status="failed" if final else "pending", error=error[:2000], attempts=outbox.c.attempts + 1)
            )

    async def pending(self, limit: int = 100) -> list[OutboxRecord]:
        async with self.db.read() as conn:
            rows = (await conn.execute(select(outbox).where(outbox.c.status == "pending").order_by(outbox.c.id).limit(limit))).all()
        return [to_record(OutboxRecord, r) for r in rows]
