"""The only package that touches the database. Everything it returns is a plain dataclass."""

from __future__ import annotations

from sqlalchemy import update

from gateway.store.base import Fence, LeaseLost, utcnow
from gateway.store.db import (
    Database,
    StoreError,
    ensure_migrated,
    migrations_current,
    upgrade,
)
from gateway.store.history import HistoryRepo
from gateway.store.inbox import InboxRepo, NewItem
from gateway.store.outbox import OutboxRepo
from gateway.store.prompts import Decision, PromptRepo
from gateway.store.records import *  # noqa: F403 - the record types are the store's vocabulary
from gateway.store.runs import RunRepo
from gateway.store.schedules import ScheduleRepo
from gateway.store.sessions import SessionRepo
from gateway.store.tables import inbox


class Store:
    def __init__(self, url: str, *, echo: bool = False, pg_schema: str | None = None):
        self.db = Database(url, echo=echo, pg_schema=pg_schema)
        self.sessions = SessionRepo(self.db)
        self.runs = RunRepo(self.db)
        self.inbox = InboxRepo(self.db)
        self.prompts = PromptRepo(self.db)
        self.outbox = OutboxRepo(self.db)
        self.schedules = ScheduleRepo(self.db)
        self.history = HistoryRepo(self.db)

    @property
    def is_sqlite(self) -> bool:
        return self.db.is_sqlite

    async def consume_messages(
        self, session_id: int, items: list[tuple[int, dict]], *, fence: Fence | None = None, run_id: int | None = None
    ) -> list[MessageRecord]:  # noqa: F405
        """Append inbox messages to a session as user rows and mark the items done, in one
        transaction: a crash can neither lose them nor append them twice."""
        async with self.db.write() as conn:
            records = []
            for item_id, payload in items:
                sender = payload.get("sender") or {}
                records.append(
                    await self.sessions.append(
                        session_id, "user", str(payload.get("text", "")), synthetic=sender.get("id") == "scheduler",
                        sender_id=sender.get("id"), sender_name=sender.get("name"), run_id=run_id, fence=fence, conn=conn,
                    )
                )
                await conn.execute(
                    update(inbox).where(inbox.c.id == item_id).values(status="done", done_at=utcnow(), session_id=session_id)
                )
        return records

    async def migrate(self, *, auto: bool = True) -> None:
        await ensure_migrated(self.db, auto_migrate=auto)

    async def close(self) -> None:
        await self.db.dispose()


__all__ = ["Store", "Database", "StoreError", "Fence", "LeaseLost", "NewItem", "Decision", "upgrade", "migrations_current"]
