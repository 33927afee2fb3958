"""Pruning what is finished and old: done inbox items, delivered outbox rows, decided
prompts, the events of finished runs and old rows of the audit trail. Never pending, held or
parked work (kept group chatter and noted edits are pruned by the time they were stored).
In batches, each its own short transaction, so a large backlog never holds locks
for long."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Table, delete, select
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from gateway.events import utcnow
from gateway.store.base import Repo
from gateway.store.tables import audit, inbox, outbox, prompts, run_events, runs

FINISHED_RUNS = ("SUCCESS", "FAILED", "CANCELED")
_FINISHED_ITEMS = ("done", "dropped", "context", "note")  # context, note: kept chatter, noted edits


@dataclass(frozen=True)
class RetentionDays:
    inbox: float = 30
    outbox: float = 30
    prompts: float = 30
    run_events: float = 30
    audit: float = 90


class RetentionRepo(Repo):
    async def prune(self, days: RetentionDays, *, batch: int = 1000) -> dict[str, int]:
        """Delete what is past its retention; returns the rows deleted per table."""
        now = utcnow()

        def before(value: float) -> object:
            return now - timedelta(days=value)

        targets: dict[str, tuple[Table, ColumnElement[bool]]] = {
            "inbox": (inbox, inbox.c.status.in_(_FINISHED_ITEMS) & (inbox.c.done_at < before(days.inbox))),
            "outbox": (outbox, outbox.c.status.in_(("sent", "failed")) & (outbox.c.created_at < before(days.outbox))),
            "prompts": (
                prompts,
                (prompts.c.status != "pending") & (prompts.c.created_at < before(days.prompts)),
            ),
            "run_events": (
                run_events,
                (run_events.c.at < before(days.run_events))
                & run_events.c.run_id.in_(select(runs.c.id).where(runs.c.stage.in_(FINISHED_RUNS))),
            ),
            "audit": (audit, audit.c.at < before(days.audit)),
        }
        keep = {name for name in targets if getattr(days, name) <= 0}  # 0: kept forever
        counts: dict[str, int] = {}
        for name, (table, condition) in targets.items():
            if name not in keep:
                counts[name] = await self._in_batches(table, condition, batch)
        return counts

    async def _in_batches(self, table: Table, condition: ColumnElement[bool], batch: int) -> int:
        ids = select(table.c.id).where(condition).limit(batch).scalar_subquery()
        statement = delete(table).where(table.c.id.in_(ids))
        total = 0
        while True:
            deleted = await self.db.write(lambda conn: _run(conn, statement))
            total += deleted
            if deleted < batch:
                return total


def _run(conn: Connection, statement) -> int:  # noqa: ANN001
    return conn.execute(statement).rowcount
