"""The durable inbox, leases with fencing tokens, channel cursors and counters."""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import ModuleType
from typing import Any

from sqlalchemy import (
    Insert,
    Integer,
    Table,
    and_,
    bindparam,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.engine import Connection

from gateway.events import utcnow
from gateway.store import notify
from gateway.store.base import Fence, Repo, check_fence, to_record
from gateway.store.records import InboxItem, Lease
from gateway.store.tables import access_requests, counters, cursors, inbox, leases, prompts


@dataclass(frozen=True)
class NewItem:
    event_id: str
    thread_key: str
    kind: str
    payload: dict[str, Any]
    status: str = "pending"  # "done" records an event only for dedupe (button presses)


def _dialect_module(conn: Connection) -> ModuleType:
    # Imported when first used: a gateway on SQLite never loads the PostgreSQL dialect.
    name = "postgresql" if conn.dialect.name == "postgresql" else "sqlite"
    return importlib.import_module(f"sqlalchemy.dialects.{name}")


def insert_ignoring(conn: Connection, table: Table, keys: list[str]) -> Insert:
    """INSERT ... ON CONFLICT DO NOTHING for the connection's dialect."""
    return _dialect_module(conn).insert(table).on_conflict_do_nothing(index_elements=keys)


class InsertIgnoring:
    """`insert_ignoring` built once per dialect (optionally RETURNING `returning`); the values
    come with each execute."""

    def __init__(self, table: Table, keys: list[str], *, returning: tuple = ()):
        self._table, self._keys, self._returning = table, keys, returning
        self._by_dialect: dict[str, Insert] = {}

    def for_conn(self, conn: Connection) -> Insert:
        statement = self._by_dialect.get(conn.dialect.name)
        if statement is None:
            statement = insert_ignoring(conn, self._table, self._keys)
            if self._returning:
                statement = statement.returning(*self._returning)
            self._by_dialect[conn.dialect.name] = statement
        return statement


# Statements of intake, the dispatcher's poll and the workers' leases, built once (building
# one costs more than running it). Bound names avoid column names, which update() reserves
# for the SET values that come with each execute.
_ADD_ITEM = InsertIgnoring(inbox, ["event_id"])
_PENDING_THREADS = (
    select(inbox.c.thread_key, func.min(inbox.c.id).label("first"))
    .where(inbox.c.status == "pending")
    .group_by(inbox.c.thread_key)
    .order_by("first")
    .limit(bindparam("limit", type_=Integer))
)
_PENDING = (
    select(inbox)
    .where(inbox.c.thread_key == bindparam("thread"), inbox.c.status == "pending")
    .order_by(inbox.c.id)
    .limit(bindparam("limit", type_=Integer))
)
_FINISH = update(inbox).where(inbox.c.id.in_(bindparam("item_ids", expanding=True)), inbox.c.status == "pending")

_SET_PAYLOAD = update(inbox).where(inbox.c.id == bindparam("item_id"))

_RESUME_WAITS = (
    select(inbox.c.id)
    .where(inbox.c.thread_key == bindparam("thread_key"), inbox.c.status == "pending", inbox.c.kind == "resume")
    .limit(1)
)
_HELD_LEASES = select(leases.c.name).where(
    leases.c.name.in_(bindparam("names", expanding=True)), leases.c.owner.is_not(None),
    leases.c.expires_at > bindparam("now"),
)
# Taking a lease, each case one statement that says what it found (RETURNING): a free lease
# (released, or never held; the common case, a thread's lease is released after each turn),
# one's own still held, one expired (a takeover from a holder that stopped renewing), and a
# name never seen (inserted held). The cases are disjoint, so their order only saves statements.
_LEASE_TAKEN = (leases.c.fence, leases.c.expires_at)
_TAKE_FREE_LEASE = (
    update(leases)
    .where(leases.c.name == bindparam("lease_name"), or_(leases.c.owner.is_(None), leases.c.expires_at.is_(None)))
    .values(fence=leases.c.fence + 1)
    .returning(*_LEASE_TAKEN)
)
_EXTEND_OWN_LEASE = (
    update(leases)
    .where(
        leases.c.name == bindparam("lease_name"),
        leases.c.owner == bindparam("lease_owner"),
        leases.c.expires_at > bindparam("now"),
    )
    .returning(*_LEASE_TAKEN)
)
_TAKE_OVER_LEASE = (
    update(leases)
    .where(leases.c.name == bindparam("lease_name"), leases.c.expires_at <= bindparam("now"))
    .values(fence=leases.c.fence + 1)
    .returning(*_LEASE_TAKEN)
)
_ADD_HELD_LEASE = InsertIgnoring(leases, ["name"], returning=_LEASE_TAKEN)
_HELD_LEASE = and_(
    leases.c.name == bindparam("lease_name"),
    leases.c.owner == bindparam("lease_owner"),
    leases.c.fence == bindparam("lease_fence"),
)
_RENEW_LEASE = update(leases).where(_HELD_LEASE)
_RELEASE_LEASE = update(leases).where(_HELD_LEASE).values(owner=None, expires_at=None)

_UPDATE_CURSOR = update(cursors).where(cursors.c.name == bindparam("cursor_name"))
_ADD_CURSOR = InsertIgnoring(cursors, ["name"])


def _held_lease_params(lease: Lease) -> dict[str, Any]:
    return {"lease_name": lease.name, "lease_owner": lease.owner, "lease_fence": lease.fence}


class InboxRepo(Repo):
    # ---- intake ----------------------------------------------------------------------------
    async def add(self, items: Sequence[NewItem], *, cursor: tuple[str, str] | None = None) -> list[bool]:
        """Insert items (duplicates by event id ignored) and the cursor in one transaction.

        Returns, per item, whether it was new.
        """

        def work(conn: Connection) -> list[bool]:
            created = [self.add_in(conn, item) for item in items]
            if cursor is not None:
                self.set_cursor_in(conn, *cursor)
            notify.publish_in(conn, {i.thread_key for i, new in zip(items, created, strict=True) if new})
            return created

        return await self.db.write(work)

    @staticmethod
    def add_in(conn: Connection, item: NewItem) -> bool:
        result = conn.execute(
            _ADD_ITEM.for_conn(conn),
            {
                "event_id": item.event_id,
                "thread_key": item.thread_key,
                "kind": item.kind,
                "payload": item.payload,
                "status": item.status,
                "created_at": utcnow(),
            },
        )
        return result.rowcount == 1

    @staticmethod
    def release_held_in(conn: Connection, thread_key: str, *, take_reason: bool, reason_from: str = "") -> str | None:
        """Held items of the thread become pending again; with `take_reason` the newest held
        message of `reason_from` (the person deciding) is consumed and its text returned: a
        reason typed by someone else is not theirs to give."""
        held = conn.execute(
            select(inbox).where(inbox.c.thread_key == thread_key, inbox.c.status == "held").order_by(inbox.c.id)
        ).all()
        reason = None
        theirs = [h for h in held if str((h.payload.get("sender") or {}).get("id", "")) == reason_from]
        if take_reason and theirs:
            last = theirs[-1]
            reason = str(last.payload.get("text", "")).strip() or None
            conn.execute(update(inbox).where(inbox.c.id == last.id).values(status="done", done_at=utcnow()))
        if held:
            conn.execute(
                update(inbox).where(inbox.c.thread_key == thread_key, inbox.c.status == "held").values(status="pending")
            )
        return reason

    async def add_continuation(self, item: NewItem, run_id: int) -> bool:
        """Queue a run's continue item unless one is waiting already. A run continued once
        (its item done) can be left RUNNING again (resumed, then killed): it gets a new item,
        not a duplicate ignored for the old one's id (it would never be continued)."""
        waiting = await self.pending(item.thread_key, limit=1000)
        if any(i.kind == "resume" and i.payload.get("continue_run") == run_id for i in waiting):
            return False
        if (await self.add([item]))[0]:
            return True
        again = NewItem(f"{item.event_id}:{uuid.uuid4().hex[:12]}", item.thread_key, item.kind, item.payload)
        return (await self.add([again]))[0]

    async def set_payload(self, item_id: int, payload: dict[str, Any]) -> None:
        """Progress recorded on an item (its attachments' outcomes)."""
        await self.db.write(lambda conn: conn.execute(_SET_PAYLOAD, {"item_id": item_id, "payload": payload}))

    async def hold_for_access(self, item_id: int, request_id: int, *, fence: Fence | None = None) -> str:
        """Hold the item while its access request is pending; else the request's status (the
        decision landed since the gatekeeper read it: it released the thread's held items
        already, so this one is never held for good). Fenced like the worker's other writes,
        the request row locked first, as the decision locks it."""

        def work(conn: Connection) -> str:
            check_fence(conn, fence)
            request = conn.execute(
                select(access_requests.c.status, access_requests.c.expires_at)
                .where(access_requests.c.id == request_id)
                .with_for_update()
            ).first()
            if request is None:
                return "unknown"
            if request.status != "pending" or request.expires_at <= utcnow():
                return str(request.status) if request.status != "pending" else "expired"
            conn.execute(update(inbox).where(inbox.c.id == item_id, inbox.c.status == "pending").values(status="held"))
            return "held"

        return await self.db.write(work)

    async def hold_while_waiting(self, item_id: int, prompt_ids: Sequence[int]) -> bool:
        """Hold the item while one of these prompts is still pending; False (not held) when
        they were all decided meanwhile. The prompt rows are locked first, so a decision
        committing at the same moment either sees the item held (and releases it with the
        others) or was already written (and the item is not held: it is handled now)."""

        def work(conn: Connection) -> bool:
            waiting = conn.execute(
                select(prompts.c.id)
                .where(prompts.c.id.in_(list(prompt_ids)), prompts.c.status == "pending")
                .with_for_update()
            ).all()
            if not waiting:
                return False
            conn.execute(update(inbox).where(inbox.c.id == item_id, inbox.c.status == "pending").values(status="held"))
            return True

        return await self.db.write(work)

    # ---- consumption -----------------------------------------------------------------------
    async def pending_threads(self, *, limit: int = 100, exclude: Sequence[str] = ()) -> list[str]:
        """Threads with pending items, oldest first."""
        rows = await self.db.read(lambda conn: conn.execute(_PENDING_THREADS, {"limit": limit + len(exclude)}).all())
        skip = set(exclude)
        return [r.thread_key for r in rows if r.thread_key not in skip][:limit]

    async def pending(self, thread_key: str, *, limit: int = 100) -> list[InboxItem]:
        def work(conn: Connection) -> list[InboxItem]:
            rows = conn.execute(_PENDING, {"thread": thread_key, "limit": limit}).all()
            return [to_record(InboxItem, r) for r in rows]

        return await self.db.read(work)

    async def finish(
        self,
        item_ids: Sequence[int],
        *,
        status: str = "done",
        session_id: int | None = None,
        fence: Fence | None = None,
    ) -> None:
        if not item_ids:
            return
        # The SET columns come with the parameters (session_id only when given).
        params = self.finish_params(item_ids, status)
        if session_id is not None:
            params["session_id"] = session_id

        def work(conn: Connection) -> None:
            check_fence(conn, fence)
            self.finish_in(conn, params)

        await self.db.write(work)

    @staticmethod
    def finish_in(conn: Connection, params: dict[str, Any]) -> None:
        conn.execute(_FINISH, params)

    @staticmethod
    def finish_params(item_ids: Sequence[int], status: str = "done") -> dict[str, Any]:
        return {"item_ids": list(item_ids), "status": status, "done_at": utcnow()}

    async def drop_pending(
        self,
        thread_key: str,
        *,
        kinds: Sequence[str] = ("message",),
        before_id: int | None = None,
        session_id: int | None = None,
    ) -> int:
        """Drop queued (and held) items of the thread, e.g. on /stop: those that arrived before
        item `before_id` when given. They stay recorded as `dropped`, with the session."""
        statement = update(inbox).where(
            inbox.c.thread_key == thread_key, inbox.c.status.in_(("pending", "held")), inbox.c.kind.in_(list(kinds))
        )
        if before_id is not None:
            statement = statement.where(inbox.c.id < before_id)
        statement = statement.values(status="dropped", done_at=utcnow(), session_id=session_id)
        return await self.db.write(lambda conn: conn.execute(statement).rowcount)

    async def dropped(self, thread_key: str, *, session_id: int | None = None, limit: int = 100) -> list[InboxItem]:
        """Items dropped unhandled (by /stop), oldest first."""
        query = select(inbox).where(inbox.c.thread_key == thread_key, inbox.c.status == "dropped")
        if session_id is not None:
            query = query.where(inbox.c.session_id == session_id)

        def work(conn: Connection) -> list[InboxItem]:
            return [to_record(InboxItem, r) for r in conn.execute(query.order_by(inbox.c.id).limit(limit)).all()]

        return await self.db.read(work)

    @staticmethod
    def resume_waits_in(conn: Connection, thread_key: str) -> bool:
        return conn.execute(_RESUME_WAITS, {"thread_key": thread_key}).first() is not None

    async def count_pending(self, thread_key: str | None = None, *, kinds: Sequence[str] | None = None) -> int:
        query = select(func.count()).select_from(inbox).where(inbox.c.status == "pending")
        if kinds is not None:
            query = query.where(inbox.c.kind.in_(list(kinds)))
        if thread_key is not None:
            query = query.where(inbox.c.thread_key == thread_key)
        return await self.db.read(lambda conn: conn.execute(query).scalar_one())

    async def get_by_event(self, event_id: str) -> InboxItem | None:
        def work(conn: Connection) -> InboxItem | None:
            row = conn.execute(select(inbox).where(inbox.c.event_id == event_id)).first()
            return to_record(InboxItem, row) if row else None

        return await self.db.read(work)

    # ---- leases ----------------------------------------------------------------------------
    async def acquire(self, name: str, owner: str, ttl_s: float, *, now: datetime | None = None) -> Lease | None:
        """Take or renew a lease. A takeover (expired or free) bumps the fencing token. `now`:
        the time expiry is judged at (a `Clock`'s; the system's by default)."""
        now = now or utcnow()
        expires = now + timedelta(seconds=ttl_s)

        def work(conn: Connection) -> Lease | None:
            params = {"lease_name": name, "lease_owner": owner, "now": now, "owner": owner, "expires_at": expires}
            for statement, taken_over, unreleased in (
                (_TAKE_FREE_LEASE, False, False),
                (_EXTEND_OWN_LEASE, False, True),
                (_TAKE_OVER_LEASE, True, True),
            ):
                if (row := conn.execute(statement, params).first()) is not None:
                    return Lease(name, owner, row.fence, row.expires_at, taken_over=taken_over, unreleased=unreleased)
            added = {"name": name, "owner": owner, "fence": 1, "expires_at": expires}
            if (row := conn.execute(_ADD_HELD_LEASE.for_conn(conn), added).first()) is not None:
                return Lease(name, owner, row.fence, row.expires_at)
            return None  # held by another

        return await self.db.write(work)

    async def renew(self, lease: Lease, ttl_s: float) -> Lease | None:
        expires = utcnow() + timedelta(seconds=ttl_s)
        renewed = await self.db.write(
            lambda conn: conn.execute(_RENEW_LEASE, {**_held_lease_params(lease), "expires_at": expires}).rowcount
        )
        if renewed != 1:
            return None
        return Lease(lease.name, lease.owner, lease.fence, expires)

    async def release(self, lease: Lease) -> None:
        await self.db.write(lambda conn: conn.execute(_RELEASE_LEASE, _held_lease_params(lease)))

    async def release_all(self, owner: str) -> None:
        await self.db.write(
            lambda conn: conn.execute(update(leases).where(leases.c.owner == owner).values(owner=None, expires_at=None))
        )

    async def held_leases(self, names: Sequence[str]) -> set[str]:
        """Which of `names` are held (owned and not expired) now."""
        if not names:
            return set()
        return await self.db.read(
            lambda conn: {row.name for row in conn.execute(_HELD_LEASES, {"names": list(names), "now": utcnow()})}
        )

    async def count_held(self, prefix: str) -> int:
        """How many leases named `prefix`... are held (owned and not expired) now."""
        held = (leases.c.name.like(f"{prefix}%"), leases.c.owner.is_not(None), leases.c.expires_at > bindparam("now"))
        statement = select(func.count()).select_from(leases).where(*held)
        if self.db.is_sqlite:
            # SQLite's LIKE ignores case, so it cannot use the key's index; in its binary order
            # the names starting with `prefix` are a range of it (one row per thread ever seen).
            after = prefix[:-1] + chr(ord(prefix[-1]) + 1)
            statement = statement.where(leases.c.name >= prefix, leases.c.name < after)
        return int(await self.db.read(lambda conn: conn.execute(statement, {"now": utcnow()}).scalar_one()))

    async def lease_holder(self, name: str) -> Lease | None:
        def work(conn: Connection) -> Lease | None:
            row = conn.execute(
                select(leases).where(leases.c.name == name, leases.c.owner.is_not(None), leases.c.expires_at > utcnow())
            ).first()
            return Lease(row.name, row.owner, row.fence, row.expires_at) if row else None

        return await self.db.read(work)

    # ---- cursors and counters --------------------------------------------------------------
    @staticmethod
    def set_cursor_in(conn: Connection, name: str, value: str) -> None:
        now = utcnow()
        updated = conn.execute(_UPDATE_CURSOR, {"cursor_name": name, "value": value, "updated_at": now})
        if updated.rowcount == 0:
            conn.execute(_ADD_CURSOR.for_conn(conn), {"name": name, "value": value, "updated_at": now})

    async def load_cursor(self, name: str) -> str | None:
        return await self.db.read(
            lambda conn: conn.execute(select(cursors.c.value).where(cursors.c.name == name)).scalar()
        )

    async def bump_counter(self, name: str, by: int = 1) -> int:
        def work(conn: Connection) -> int:
            conn.execute(insert_ignoring(conn, counters, ["name"]).values(name=name, value=0, updated_at=utcnow()))
            return conn.execute(
                update(counters)
                .where(counters.c.name == name)
                .values(value=counters.c.value + by, updated_at=utcnow())
                .returning(counters.c.value)
            ).scalar_one()

        return await self.db.write(work)
