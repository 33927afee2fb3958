"""What the web console reads that no other part needs: instances' heartbeats, the counts of the
overview (each one aggregate query), decided prompts and a session search."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, or_, select
from sqlalchemy.engine import Connection

from gateway.events import utcnow
from gateway.store.base import Repo, to_record
from gateway.store.records import PromptRecord, SessionRecord
from gateway.store.tables import leases, messages, outbox, prompts, runs, sessions

HEARTBEAT_PREFIX = "instance:"  # a lease each instance renews while it runs: its heartbeat


@dataclass(frozen=True)
class InstanceBeat:
    instance_id: str
    expires_at: datetime


@dataclass(frozen=True)
class OverviewCounts:
    turns_running: int
    awaiting_input: int
    errors_last_hour: int
    stuck_outbox: int


class ConsoleRepo(Repo):
    async def instances(self) -> list[InstanceBeat]:
        """Instances whose heartbeat lease is held (expired ones too: shown as silent)."""

        def work(conn: Connection) -> list[InstanceBeat]:
            rows = conn.execute(
                select(leases.c.owner, leases.c.expires_at)
                .where(leases.c.name.like(f"{HEARTBEAT_PREFIX}%"), leases.c.owner.is_not(None))
                .order_by(leases.c.name)
            ).all()
            return [InstanceBeat(row.owner, row.expires_at) for row in rows]

        return await self.db.read(work)

    async def counts(self, *, stuck_after: timedelta, now: datetime | None = None) -> OverviewCounts:
        moment = now or utcnow()

        def work(conn: Connection) -> OverviewCounts:
            by_stage: dict[str, int] = dict(
                conn.execute(
                    select(runs.c.stage, func.count())
                    .where(runs.c.stage.in_(("RUNNING", "AWAITING_INPUT")))
                    .group_by(runs.c.stage)
                ).all()
            )
            errors = conn.execute(
                select(func.count())
                .select_from(runs)
                .where(runs.c.stage == "FAILED", runs.c.finished_at > moment - timedelta(hours=1))
            ).scalar_one()
            stuck = conn.execute(
                select(func.count())
                .select_from(outbox)
                .where(outbox.c.status == "pending", outbox.c.created_at < moment - stuck_after)
            ).scalar_one()
            return OverviewCounts(
                by_stage.get("RUNNING", 0), by_stage.get("AWAITING_INPUT", 0), int(errors), int(stuck)
            )

        return await self.db.read(work)

    async def decided_prompts(self, *, kind: str = "approval", limit: int = 50) -> list[PromptRecord]:
        def work(conn: Connection) -> list[PromptRecord]:
            rows = conn.execute(
                select(prompts)
                .where(prompts.c.kind == kind, prompts.c.status != "pending")
                .order_by(prompts.c.id.desc())
                .limit(limit)
            ).all()
            return [to_record(PromptRecord, row) for row in rows]

        return await self.db.read(work)

    async def search_sessions(self, text: str = "", *, limit: int = 50) -> list[SessionRecord]:
        """Sessions whose chat (thread key) or a participant (id or name) contains `text`."""

        def work(conn: Connection) -> list[SessionRecord]:
            query = select(sessions).order_by(sessions.c.id.desc()).limit(limit)
            if text:
                pattern = f"%{text}%"
                by_sender = select(messages.c.session_id).where(
                    or_(messages.c.sender_id.like(pattern), messages.c.sender_name.like(pattern))
                )
                query = query.where(
                    or_(
                        sessions.c.thread_key.like(pattern),
                        sessions.c.started_by.like(pattern),
                        sessions.c.id.in_(by_sender),
                    )
                )
            return [to_record(SessionRecord, row) for row in conn.execute(query).all()]

        return await self.db.read(work)
