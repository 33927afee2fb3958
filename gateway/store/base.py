"""Helpers shared by the repositories: row -> dataclass, fencing, time."""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, TypeVar, cast

from sqlalchemy import bindparam, select
from sqlalchemy.engine import Connection

from gateway.store.db import Database
from gateway.store.tables import leases

T = TypeVar("T")


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in fields(cls))


def to_record(cls: type[T], row: Any, **extra: Any) -> T:
    mapping = row._mapping if hasattr(row, "_mapping") else row
    names = _field_names(cast(type, cls))
    values = {k: v for k, v in mapping.items() if k in names}
    values.update(extra)
    return cls(**values)


class LeaseLost(Exception):
    """This worker no longer holds the lease it writes under: stop writing."""


@dataclass(frozen=True)
class Fence:
    """Proof of holding a lease; writes made under it fail once someone else took over."""

    name: str
    owner: str
    token: int


# FOR UPDATE: the fenced write's transaction holds the lease row until it commits, so a takeover
# waits for it, and a takeover already under way makes the check wait and then see it (reading
# the last committed row unlocked would let a write pass while a takeover commits). SQLite
# serialises writers already (BEGIN IMMEDIATE); there the clause is left out.
_LEASE_HOLDER = select(leases.c.owner, leases.c.fence).where(leases.c.name == bindparam("name")).with_for_update()


def check_fence(conn: Connection, fence: Fence | None) -> None:
    """Raise LeaseLost unless `fence` still holds its lease, locking the lease row for the rest
    of the caller's transaction: the write that follows is conditional on the fence."""
    if fence is None:
        return
    row = conn.execute(_LEASE_HOLDER, {"name": fence.name}).first()
    if row is None or row.owner != fence.owner or row.fence != fence.token:
        raise LeaseLost(f"lease {fence.name} (fence {fence.token}) is no longer held by {fence.owner}")


class Repo:
    def __init__(self, db: Database):
        self.db = db
