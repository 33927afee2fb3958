"""What the web console reads that no other part needs: instances' heartbeats, the counts of the
overview (each one aggregate query) and the rows behind them, decided prompts, a session search,
and its login sessions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete, func, insert, or_, select
from sqlalchemy.engine import Connection

from gateway.events import utcnow
from gateway.store.base import Repo, to_record
from gateway.store.records import OutboxRecord, PromptRecord, RunRecord, SessionRecord
from gateway.store.tables import console_sessions, inbox, leases, messages, outbox, prompts, runs, sessions

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


@dataclass(frozen=True)
class WaitingThread:
    """A thread with inbox items waiting to be handled."""

    thread_key: str
    pending: int
    oldest: datetime


@dataclass(frozen=True)
class LoginSession:
    """A console login as stored: under the hash of its id, never the id."""

    id_hash: str
    username: str
    created_at: datetime
    expires_at: datetime


class ConsoleRepo(Repo):
    async def open_login(self, id_hash: str, username: str, *, now: datetime, expires_at: datetime) -> None:
        """Store a new login; logins that have expired go at the same time (nothing else prunes them)."""

        def work(conn: Connection) -> None:
            conn.execute(delete(console_sessions).where(console_sessions.c.expires_at <= now))
            conn.execute(
                insert(console_sessions).values(
                    id_hash=id_hash, username=username, created_at=now, expires_at=expires_at
                )
            )

        await self.db.write(work)

    async def login(self, id_hash: str, *, now: datetime) -> LoginSession | None:
        """The login stored under this hash, unless it has expired."""

        def work(conn: Connection) -> LoginSession | None:
            row = conn.execute(
                select(console_sessions).where(
                    console_sessions.c.id_hash == id_hash, console_sessions.c.expires_at > now
                )
            ).first()
            return to_record(LoginSession, row) if row is not None else None

        return await self.db.read(work)

    async def close_login(self, id_hash: str) -> None:
        statement = delete(console_sessions).where(console_sessions.c.id_hash == id_hash)
        await self.db.write(lambda conn: conn.execute(statement))

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
                select(func.count()).select_from(outbox).where(_stuck(moment - stuck_after))
            ).scalar_one()
            return OverviewCounts(
                by_stage.get("RUNNING", 0), by_stage.get("AWAITING_INPUT", 0), int(errors), int(stuck)
            )

        return await self.db.read(work)

    async def runs(
        self, *, stage: str | None = None, finished_after: datetime | None = None, limit: int = 100
    ) -> list[RunRecord]:
        """The newest runs in `stage` (all when None), those that finished after `finished_after`
        when it is given: the rows behind the overview's run counts."""
        query = select(runs).order_by(runs.c.id.desc()).limit(limit)
        if stage is not None:
            query = query.where(runs.c.stage == stage)
        if finished_after is not None:
            query = query.where(runs.c.finished_at > finished_after)
        return await self.db.read(lambda conn: [to_record(RunRecord, r) for r in conn.execute(query)])

    async def waiting_threads(self, *, limit: int = 100) -> list[WaitingThread]:
        """The threads with pending inbox items, the longest waiting first: the inbox depth's rows."""
        oldest = func.min(inbox.c.created_at)
        query = (
            select(inbox.c.thread_key, func.count(), oldest)
            .where(inbox.c.status == "pending")
            .group_by(inbox.c.thread_key)
            .order_by(oldest)
            .limit(limit)
        )
        rows = await self.db.read(lambda conn: conn.execute(query).all())
        return [WaitingThread(key, int(count), utc(first)) for key, count, first in rows]

    async def stuck_outbox(
        self, *, stuck_after: timedelta, now: datetime | None = None, limit: int = 100
    ) -> list[OutboxRecord]:
        """Outbox rows pending longer than `stuck_after`, the oldest first: the overview's stuck rows."""
        query = select(outbox).where(_stuck((now or utcnow()) - stuck_after)).order_by(outbox.c.id).limit(limit)
        return await self.db.read(lambda conn: [to_record(OutboxRecord, r) for r in conn.execute(query)])

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


def _stuck(before: datetime):  # noqa: ANN202 - a SQL condition
    return (outbox.c.status == "pending") & (outbox.c.created_at < before)


def utc(moment: datetime | str) -> datetime:
    """A time an aggregate handed back: SQLite gives text without a zone; it is UTC."""
    value = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
