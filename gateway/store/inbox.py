"""The durable inbox, leases with fencing tokens, channel cursors and counters."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Sequence

from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.store.base import Fence, Repo, check_fence, to_record, utcnow
from gateway.store.records import InboxItem, Lease
from gateway.store.tables import counters, cursors, inbox, leases


@dataclass(frozen=True)
class NewItem:
    event_id: str
    thread_key: str
    kind: str
    payload: dict[str, Any]
    status: str = "pending"  # "done" records an event only for dedupe (button presses)


def insert_ignoring(conn: AsyncConnection, table, keys: list[str]):  # noqa: ANN001, ANN201
    """INSERT ... ON CONFLICT DO NOTHING for the connection's dialect."""
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    return dialect.insert(table).on_conflict_do_nothing(index_elements=keys)


class InboxRepo(Repo):
    # ---- intake ----------------------------------------------------------------------------
    async def add(self, items: Sequence[NewItem], *, cursor: tuple[str, str] | None = None) -> list[bool]:
        """Insert items (duplicates by event id ignored) and the cursor in one transaction.

        Returns, per item, whether it was new.
        """
        async with self.db.write() as conn:
            created = [await self.add_in(conn, item) for item in items]
            if cursor is not None:
                await self.set_cursor_in(conn, *cursor)
        return created

    @staticmethod
    async def add_in(conn: AsyncConnection, item: NewItem) -> bool:
        result = await conn.execute(
            insert_ignoring(conn, inbox, ["event_id"]).values(
                event_id=item.event_id,
                thread_key=item.thread_key,
                kind=item.kind,
                payload=item.payload,
                status=item.status,
                created_at=utcnow(),
            )
        )
        return result.rowcount == 1

    @staticmethod
    async def release_held_in(conn: AsyncConnection, thread_key: str, *, take_reason: bool) -> str | None:
        """Held items of the thread become pending again; with `take_reason` the newest held
        message is consumed and its text returned."""
        held = (
            await conn.execute(select(inbox).where(inbox.c.thread_key == thread_key, inbox.c.status == "held").order_by(inbox.c.id))
        ).all()
        reason = None
        if take_reason and held:
            last = held[-1]
            reason = str(last.payload.get("text", "")).strip() or None
            await conn.execute(update(inbox).where(inbox.c.id == last.id).values(status="done", done_at=utcnow()))
        if held:
            await conn.execute(update(inbox).where(inbox.c.thread_key == thread_key, inbox.c.status == "held").values(status="pending"))
        return reason

    async def hold(self, item_id: int) -> None:
        async with self.db.write() as conn:
            await conn.execute(update(inbox).where(inbox.c.id == item_id, inbox.c.status == "pending").values(status="held"))

    # ---- consumption -----------------------------------------------------------------------
    async def pending_threads(self, *, limit: int = 100, exclude: Sequence[str] = ()) -> list[str]:
        """Threads with pending items, oldest first."""
        query = (
            select(inbox.c.thread_key, func.min(inbox.c.id).label("first"))
            .where(inbox.c.status == "pending")
            .group_by(inbox.c.thread_key)
            .order_by("first")
            .limit(limit + len(exclude))
        )
        async with self.db.read() as conn:
            rows = (await conn.execute(query)).all()
        skip = set(exclude)
        return [r.thread_key for r in rows if r.thread_key not in skip][:limit]

    async def pending(self, thread_key: str, *, limit: int = 100) -> list[InboxItem]:
        async with self.db.read() as conn:
            rows = (
                await conn.execute(
                    select(inbox)
                    .where(inbox.c.thread_key == thread_key, inbox.c.status == "pending")
                    .order_by(inbox.c.id)
                    .limit(limit)
                )
            ).all()
        return [to_record(InboxItem, r) for r in rows]

    async def finish(self, item_ids: Sequence[int], *, status: str = "done", session_id: int | None = None, fence: Fence | None = None) -> None:
        if not item_ids:
            return
        values: dict[str, Any] = {"status": status, "done_at": utcnow()}
        if session_id is not None:
            values["session_id"] = session_id
        async with self.db.write() as conn:
            await check_fence(conn, fence)
            await conn.execute(update(inbox).where(inbox.c.id.in_(list(item_ids)), inbox.c.status == "pending").values(**values))

    async def drop_pending(self, thread_key: str, *, kinds: Sequence[str] = ("message",)) -> int:
        """Drop queued (and held) items of the thread, e.g. on /stop."""
        async with self.db.write() as conn:
            result = await conn.execute(
                update(inbox)
                .where(inbox.c.thread_key == thread_key, inbox.c.status.in_(("pending", "held")), inbox.c.kind.in_(list(kinds)))
                .values(status="dropped", done_at=utcnow())
            )
        return result.rowcount

    async def count_pending(self, thread_key: str | None = None, *, kinds: Sequence[str] | None = None) -> int:
        query = select(func.count()).select_from(inbox).where(inbox.c.status == "pending")
        if kinds is not None:
            query = query.where(inbox.c.kind.in_(list(kinds)))
        if thread_key is not None:
            query = query.where(inbox.c.thread_key == thread_key)
        async with self.db.read() as conn:
            return (await conn.execute(query)).scalar_one()

    async def get_by_event(self, event_id: str) -> InboxItem | None:
        async with self.db.read() as conn:
            row = (await conn.execute(select(inbox).where(inbox.c.event_id == event_id))).first()
        return to_record(InboxItem, row) if row else None

    # ---- leases ----------------------------------------------------------------------------
    async def acquire(self, name: str, owner: str, ttl_s: float) -> Lease | None:
        """Take or renew a lease. A takeover (expired or free) bumps the fencing token."""
        now = utcnow()
        expires = now + timedelta(seconds=ttl_s)
        async with self.db.write() as conn:
            await conn.execute(insert_ignoring(conn, leases, ["name"]).values(name=name, owner=None, fence=0, expires_at=None))
            mine = await conn.execute(
                update(leases)
                .where(leases.c.name == name, leases.c.owner == owner, leases.c.expires_at > now)
                .values(expires_at=expires)
            )
            if mine.rowcount != 1:
                taken = await conn.execute(
                    update(leases)
                    .where(leases.c.name == name, or_(leases.c.owner.is_(None), leases.c.expires_at.is_(None), leases.c.expires_at <= now))
                    .values(owner=owner, fence=leases.c.fence + 1, expires_at=expires)
                )
                if taken.rowcount != 1:
                    return None
            row = (await conn.execute(select(leases).where(leases.c.name == name))).first()
        return Lease(name=row.name, owner=row.owner, fence=row.fence, expires_at=row.expires_at)

    async def renew(self, lease: Lease, ttl_s: float) -> Lease | None:
        expires = utcnow() + timedelta(seconds=ttl_s)
        async with self.db.write() as conn:
            result = await conn.execute(
                update(leases)
                .where(leases.c.name == lease.name, leases.c.owner == lease.owner, leases.c.fence == lease.fence)
                .values(expires_at=expires)
            )
        if result.rowcount != 1:
            return None
        return Lease(lease.name, lease.owner, lease.fence, expires)

    async def release(self, lease: Lease) -> None:
        async with self.db.write() as conn:
            await conn.execute(
                update(leases)
                .where(leases.c.name == lease.name, leases.c.owner == lease.owner, leases.c.fence == lease.fence)
                .values(owner=None, expires_at=None)
            )

    async def release_all(self, owner: str) -> None:
        async with self.db.write() as conn:
            await conn.execute(update(leases).where(leases.c.owner == owner).values(owner=None, expires_at=None))

    async def lease_holder(self, name: str) -> Lease | None:
        async with self.db.read() as conn:
            row = (await conn.execute(select(leases).where(leases.c.name == name, leases.c.owner.is_not(None), leases.c.expires_at > utcnow()))).first()
        return Lease(row.name, row.owner, row.fence, row.expires_at) if row else None

    # ---- cursors and counters --------------------------------------------------------------
    @staticmethod
    async def set_cursor_in(conn: AsyncConnection, name: str, value: str) -> None:
        updated = await conn.execute(update(cursors).where(cursors.c.name == name).values(value=value, updated_at=utcnow()))
        if updated.rowcount == 0:
            await conn.execute(insert_ignoring(conn, cursors, ["name"]).values(name=name, value=value, updated_at=utcnow()))

    async def load_cursor(self, name: str) -> str | None:
        async with self.db.read() as conn:
            return (await conn.execute(select(cursors.c.value).where(cursors.c.name == name))).scalar()

    async def bump_counter(self, name: str, by: int = 1) -> int:
        async with self.db.write() as conn:
            await conn.execute(insert_ignoring(conn, counters, ["name"]).values(name=name, value=0, updated_at=utcnow()))
            return (
                await conn.execute(
                    update(counters).where(counters.c.name == name).values(value=counters.c.value + by, updated_at=utcnow()).returning(counters.c.value)
                )
            ).scalar_one()

    async def prune_counters(self, older_than_days: int = 7) -> None:
        async with self.db.write() as conn:
            await conn.execute(delete(counters).where(counters.c.updated_at < utcnow() - timedelta(days=older_than_days)))

