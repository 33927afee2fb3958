"""Spend counters and reservations of the spend caps.

A reservation takes a call's worst case on every counter its caps name, each with one
conditional UPDATE whose WHERE holds the cap (`used + reserved + amount <= cap`), in one
transaction: on PostgreSQL the row lock makes a concurrent reservation re-check the cap against
the committed amounts, on SQLite writes are serial, so calls on any number of instances can never
reserve past a cap together. Counters are always taken in one order (no deadlocks). Settling
replaces the reservation by the call's actual use; a reservation nobody settled (a crash) is
counted in full once it is old (`sweep`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import bindparam, delete, insert, literal, or_, select, update
from sqlalchemy.engine import Connection

from gateway.events import utcnow
from gateway.store.audit import AuditEntry, AuditRepo
from gateway.store.base import Repo, to_record
from gateway.store.inbox import InsertIgnoring
from gateway.store.tables import budget_counters, budget_reservations

_ADD_COUNTER = InsertIgnoring(budget_counters, ["scope", "subject", "period", "period_key"])
_C = budget_counters.c


@dataclass(frozen=True)
class CounterKey:
    scope: str
    subject: str
    period: str
    period_key: str


@dataclass(frozen=True)
class Limit:
    """A counter and the caps on it (nano-USD, tokens; None = no cap of that kind)."""

    key: CounterKey
    nano_usd: int | None
    tokens: int | None


@dataclass(frozen=True)
class CounterRecord:
    id: int
    scope: str
    subject: str
    period: str
    period_key: str
    used_nano_usd: int
    reserved_nano_usd: int
    used_tokens: int
    reserved_tokens: int
    alerted_permille: int
    updated_at: datetime


@dataclass(frozen=True)
class Reserved:
    id: int  # the reservation
    counters: tuple[int, ...]


@dataclass(frozen=True)
class Refused:
    limit: Limit  # the first cap that has no room
    counter: CounterRecord | None


class _NoRoom(Exception):
    def __init__(self, limit: Limit):
        super().__init__(limit.key)
        self.limit = limit


def _room(limit: Limit, nano: int, tokens: int):  # noqa: ANN202 - a SQL condition
    conditions = []
    if limit.nano_usd is not None:
        conditions.append(_C.used_nano_usd + _C.reserved_nano_usd + literal(nano) <= limit.nano_usd)
    if limit.tokens is not None:
        conditions.append(_C.used_tokens + _C.reserved_tokens + literal(tokens) <= limit.tokens)
    return conditions


def _key_condition(key: CounterKey):  # noqa: ANN202
    return (
        (_C.scope == key.scope)
        & (_C.subject == key.subject)
        & (_C.period == key.period)
        & (_C.period_key == key.period_key)
    )


def _add_counter(conn: Connection, key: CounterKey, now: datetime) -> None:
    conn.execute(
        _ADD_COUNTER.for_conn(conn),
        {
            **key.__dict__,
            "used_nano_usd": 0,
            "reserved_nano_usd": 0,
            "used_tokens": 0,
            "reserved_tokens": 0,
            "alerted_permille": 0,
            "updated_at": now,
        },
    )


def _move(
    conn: Connection,
    counter_ids: Sequence[int],
    *,
    reserved_nano: int,
    reserved_tokens: int,
    used_nano: int,
    used_tokens: int,
    now: datetime,
) -> None:
    """Take a reservation off the counters and add what was used, in id order."""
    for counter_id in sorted(counter_ids):
        conn.execute(
            update(budget_counters)
            .where(_C.id == counter_id)
            .values(
                reserved_nano_usd=_C.reserved_nano_usd - reserved_nano,
                reserved_tokens=_C.reserved_tokens - reserved_tokens,
                used_nano_usd=_C.used_nano_usd + used_nano,
                used_tokens=_C.used_tokens + used_tokens,
                updated_at=now,
            )
        )


_SETTLE = (
    delete(budget_reservations).where(budget_reservations.c.id == bindparam("rid")).returning(*budget_reservations.c)
)


class BudgetRepo(Repo):
    async def reserve(self, limits: Sequence[Limit], *, nano_usd: int, tokens: int, ttl_s: float) -> Reserved | Refused:
        ordered = sorted(limits, key=lambda lim: (lim.key.scope, lim.key.subject, lim.key.period, lim.key.period_key))

        def work(conn: Connection) -> Reserved:
            now = utcnow()
            ids = []
            for limit in ordered:
                _add_counter(conn, limit.key, now)
                row = conn.execute(
                    update(budget_counters)
                    .where(_key_condition(limit.key), *_room(limit, nano_usd, tokens))
                    .values(
                        reserved_nano_usd=_C.reserved_nano_usd + nano_usd,
                        reserved_tokens=_C.reserved_tokens + tokens,
                        updated_at=now,
                    )
                    .returning(_C.id)
                ).first()
                if row is None:
                    raise _NoRoom(limit)  # rolls back the reservations made on the other counters
                ids.append(row.id)
            reservation = conn.execute(
                insert(budget_reservations)
                .values(
                    counters=ids,
                    nano_usd=nano_usd,
                    tokens=tokens,
                    created_at=now,
                    expires_at=now + timedelta(seconds=ttl_s),
                )
                .returning(budget_reservations.c.id)
            ).scalar_one()
            return Reserved(reservation, tuple(ids))

        try:
            return await self.db.write(work)
        except _NoRoom as full:
            return Refused(full.limit, await self.counter(full.limit.key))

    async def settle(self, reservation_id: int, *, nano_usd: int, tokens: int) -> list[CounterRecord]:
        """The call used this much: the reservation is replaced by it. Returns the counters
        after, or nothing when the reservation was already counted by `sweep`."""

        def work(conn: Connection) -> list[CounterRecord]:
            row = conn.execute(_SETTLE, {"rid": reservation_id}).first()
            if row is None:
                return []
            _move(
                conn,
                row.counters,
                reserved_nano=row.nano_usd,
                reserved_tokens=row.tokens,
                used_nano=nano_usd,
                used_tokens=tokens,
                now=utcnow(),
            )
            rows = conn.execute(select(budget_counters).where(_C.id.in_(list(row.counters)))).all()
            return [to_record(CounterRecord, r) for r in rows]

        return await self.db.write(work)

    async def sweep(self) -> int:
        """Reservations past their expiry (their call never settled) count in full."""

        def work(conn: Connection) -> int:
            now = utcnow()
            rows = conn.execute(
                delete(budget_reservations)
                .where(budget_reservations.c.expires_at <= now)
                .returning(*budget_reservations.c)
            ).all()
            for row in rows:
                _move(
                    conn,
                    row.counters,
                    reserved_nano=row.nano_usd,
                    reserved_tokens=row.tokens,
                    used_nano=row.nano_usd,
                    used_tokens=row.tokens,
                    now=now,
                )
            return len(rows)

        return await self.db.write(work)

    async def claim_alert(self, counter_id: int, permille: int, *, audit: AuditEntry | None = None) -> bool:
        """True once per counter and share: the instance that moves the mark sends the alert
        (and writes its `audit` row in the same transaction)."""

        def work(conn: Connection) -> bool:
            changed = conn.execute(
                update(budget_counters)
                .where(_C.id == counter_id, _C.alerted_permille < permille)
                .values(alerted_permille=permille)
            ).rowcount
            if changed == 1 and audit is not None:
                AuditRepo.record_in(conn, audit)
            return changed == 1

        return await self.db.write(work)

    async def counter(self, key: CounterKey) -> CounterRecord | None:
        def work(conn: Connection) -> CounterRecord | None:
            row = conn.execute(select(budget_counters).where(_key_condition(key))).first()
            return to_record(CounterRecord, row) if row is not None else None

        return await self.db.read(work)

    async def counters(self, keys: Sequence[CounterKey]) -> dict[CounterKey, CounterRecord]:
        if not keys:
            return {}

        def work(conn: Connection) -> dict[CounterKey, CounterRecord]:
            rows = conn.execute(select(budget_counters).where(or_(*[_key_condition(k) for k in keys]))).all()
            found = [to_record(CounterRecord, r) for r in rows]
            return {CounterKey(c.scope, c.subject, c.period, c.period_key): c for c in found}

        return await self.db.read(work)

    async def current(self, period_keys: dict[str, str]) -> list[CounterRecord]:
        """Every counter of the current periods ({"day": "2026-12-03", ...})."""
        conditions = [(_C.period == period) & (_C.period_key == key) for period, key in period_keys.items()]
        query = select(budget_counters).where(or_(*conditions)).order_by(_C.scope, _C.subject, _C.period)
        return await self.db.read(lambda conn: [to_record(CounterRecord, r) for r in conn.execute(query).all()])


__all__ = ["BudgetRepo", "CounterKey", "CounterRecord", "Limit", "Refused", "Reserved"]
