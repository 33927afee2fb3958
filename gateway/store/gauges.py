"""What /metrics reads from the database at scrape time, in one statement of aggregate
subqueries (each served by an index on status), whatever the tables hold."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import and_, func, or_, select

from gateway.events import utcnow
from gateway.store.base import Repo
from gateway.store.outbox import SENDABLE
from gateway.store.tables import inbox, outbox


@dataclass(frozen=True)
class Gauges:
    inbox_pending: int
    inbox_oldest: datetime | None  # when the oldest pending item arrived
    outbox_retrying: int  # pending after at least one failed attempt
    outbox_stuck: int  # pending longer than `stuck_after` and nobody sending them (the sweeper's work)


def _count(table, condition):  # noqa: ANN001, ANN202
    return select(func.count()).select_from(table).where(condition).scalar_subquery()


class GaugeRepo(Repo):
    async def read(self, stuck_after: timedelta) -> Gauges:
        cutoff = utcnow() - stuck_after
        pending_sends = and_(outbox.c.status == "pending", outbox.c.kind.in_(SENDABLE))
        query = select(
            _count(inbox, inbox.c.status == "pending"),
            select(func.min(inbox.c.created_at)).where(inbox.c.status == "pending").scalar_subquery(),
            _count(outbox, and_(pending_sends, outbox.c.attempts > 0)),
            _count(
                outbox,
                and_(
                    pending_sends,
                    outbox.c.created_at < cutoff,
                    or_(outbox.c.retry_at.is_(None), outbox.c.retry_at < cutoff),
                ),
            ),
        )
        pending, oldest, retrying, stuck = await self.db.read(lambda conn: conn.execute(query).one())
        if isinstance(oldest, str):  # SQLite hands a subquery's datetime back as text
            oldest = datetime.fromisoformat(oldest)
        if oldest is not None and oldest.tzinfo is None:  # SQLite keeps no zone: it is UTC
            oldest = oldest.replace(tzinfo=UTC)
        return Gauges(pending, oldest, retrying, stuck)
