"""The pinned skills: each file's SHA-256 as approved, its origin and its status."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, insert, select, update
from sqlalchemy.engine import Connection

from gateway.events import utcnow
from gateway.store.base import Repo, to_record
from gateway.store.tables import skills


@dataclass(frozen=True)
class SkillPin:
    name: str
    origin: str
    path: str
    files: dict[str, str]
    digest: str
    status: str  # approved | disabled
    forced: list[str] | None
    approved_by: str | None
    added_at: datetime
    approved_at: datetime


class SkillRepo(Repo):
    async def all(self) -> list[SkillPin]:
        statement = select(skills).order_by(skills.c.name)
        return await self.db.read(lambda conn: [to_record(SkillPin, row) for row in conn.execute(statement)])

    async def get(self, name: str) -> SkillPin | None:
        statement = select(skills).where(skills.c.name == name)
        row = await self.db.read(lambda conn: conn.execute(statement).first())
        return to_record(SkillPin, row) if row is not None else None

    async def pin(
        self,
        name: str,
        *,
        origin: str,
        path: str,
        files: dict[str, str],
        digest: str,
        approved_by: str,
        forced: list[str] | None = None,
        status: str = "approved",
    ) -> None:
        """Record (or replace) the approved content of a skill; offered from now on unless `status`
        is "disabled" (a disabled skill's new content is approved without enabling it)."""

        def work(conn: Connection) -> None:
            now = utcnow()
            values: dict[str, Any] = {
                "origin": origin, "path": path, "files": files, "digest": digest, "status": status,
                "forced": forced or None, "approved_by": approved_by, "approved_at": now,
            }
            changed = conn.execute(update(skills).where(skills.c.name == name).values(**values))
            if changed.rowcount == 0:
                conn.execute(insert(skills).values(name=name, added_at=now, **values))

        await self.db.write(work)

    async def set_status(self, name: str, status: str) -> bool:
        statement = update(skills).where(skills.c.name == name).values(status=status)
        return await self.db.write(lambda conn: conn.execute(statement).rowcount > 0)

    async def remove(self, name: str) -> bool:
        statement = delete(skills).where(skills.c.name == name)
        return await self.db.write(lambda conn: conn.execute(statement).rowcount > 0)
