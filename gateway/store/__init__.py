"""The only package that touches the database. Everything it returns is a plain dataclass."""

from __future__ import annotations

from gateway.store.base import Fence, LeaseLost
from gateway.store.db import Database, StoreError, ensure_migrated, migrations_current, upgrade
from gateway.store.inbox import InboxRepo, NewItem
from gateway.store.outbox import OutboxRepo
from gateway.store.prompts import Decision, PromptRepo
from gateway.store.records import *  # noqa: F403 - the record types are the store's vocabulary
from gateway.store.runs import RunRepo
from gateway.store.sessions import SessionRepo


class Store:
    def __init__(self, url: str, *, echo: bool = False, pg_schema: str | None = None):
        self.db = Database(url, echo=echo, pg_schema=pg_schema)
        self.sessions = SessionRepo(self.db)
        self.runs = RunRepo(self.db)
        self.inbox = InboxRepo(self.db)
        self.prompts = PromptRepo(self.db)
        self.outbox = OutboxRepo(self.db)

    @property
    def is_sqlite(self) -> bool:
        return self.db.is_sqlite

    async def migrate(self, *, auto: bool = True) -> None:
        await ensure_migrated(self.db, auto_migrate=auto)

    async def close(self) -> None:
        await self.db.dispose()


__all__ = ["Store", "Database", "StoreError", "Fence", "LeaseLost", "NewItem", "Decision", "upgrade", "migrations_current"]
