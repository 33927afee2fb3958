"""Helpers shared by the repositories: row -> dataclass, fencing, time."""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.store.db import Database
from gateway.store.tables import leases

T = TypeVar("T")


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def to_record(cls: type[T], row: Any, **extra: Any) -> T:
    mapping = row._mapping if hasattr(row, "_mapping") else row
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
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


async def check_fence(conn: AsyncConnection, fence: Fence | None) -> None:
    if fence is None:
        return
    row = (
        await conn.execute(select(leases.c.owner, leases.c.fence).where(leases.c.name == fence.name))
    ).first()
    if row is None or row.owner != fence.owner or row.fence != fence.token:
        raise LeaseLost(f"lease {fence.name} (fence {fence.token}) is no longer held by {fence.owner}")


class Repo:
    def __init__(self, db: Database):
        self.db = db
