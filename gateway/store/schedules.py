"""Schedules (the jobs) and job runs (one row per firing, whatever became of it).

A firing is claimed by inserting `(schedule_id, scheduled_for)` into `job_runs`; the unique
constraint makes a second claim of the same firing a no-op, so two schedulers that briefly
both think they lead still run a job once.
"""

from __future__ import annotations

import builtins  # the repositories have a `list` method, which hides the type in their signatures
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import ColumnElement, Select, bindparam, delete, func, insert, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from gateway.events import utcnow
from gateway.store.base import Repo, to_record
from gateway.store.inbox import InsertIgnoring, insert_ignoring
from gateway.store.tables import job_runs, schedule_states, schedules

ScheduleKind = Literal["cron", "every", "at", "tick"]
JobStatus = Literal["running", "success", "failed", "canceled", "skipped", "missed"]
RunOrigin = Literal["schedule", "manual", "retry"]


class ScheduleExists(Exception):
    """A schedule with that name already exists."""


@dataclass(frozen=True)
class NewSchedule:
    """A validated schedule definition, ready to be stored."""

    name: str
    kind: ScheduleKind
    spec: str  # "0 9 * * 1-5" | "30m" | ISO time in UTC
    timezone: str
    prompt: str
    deliver_to: str = "none"
    max_rounds: int | None = None
    max_tokens: int | None = None
    model: str | None = None  # a name of llm.models; None: the default
    timeout_s: int | None = None
    misfire: Literal["run_once", "skip"] = "run_once"
    misfire_grace_s: int | None = None
    notify_on_failure: bool = True
    enabled: bool = True
    active_hours: str | None = None
    quiet_sentinel: str | None = None
    source: str = "config"  # config | cli | agent
    created_by: str | None = None
    memory_owner: str | None = None  # whose memory its runs use (the agent's jobs: where they were made)
    check_spec: dict[str, Any] | None = None  # the check before the model (scheduler/checks.py); None: none
    checklist: str | None = None  # a workspace file the tick works through
    idle_max_every: str | None = None  # idle_backoff.max_every: how far an idle tick's interval stretches
    check_failures_before_report: int | None = None  # None: scheduler.check_failures_before_report
    topic: str | None = None  # delivered into a topic of its own, by this name, in deliver_to's chat

    def definition(self) -> dict[str, Any]:
        """The fields that say what the job does (not who made it, nor whether it is on)."""
        values = asdict(self)
        for name in ("enabled", "source", "created_by", "memory_owner"):
            values.pop(name)
        return values


DEFINITION_FIELDS = tuple(NewSchedule("", "cron", "", "", "").definition())


@dataclass(frozen=True)
class ScheduleRecord:
    id: int
    name: str
    kind: ScheduleKind
    spec: str
    timezone: str
    prompt: str
    deliver_to: str
    max_rounds: int | None
    max_tokens: int | None
    timeout_s: int | None
    misfire: str
    misfire_grace_s: int | None
    notify_on_failure: bool
    enabled: bool
    disabled_reason: str | None
    active_hours: str | None
    quiet_sentinel: str | None
    source: str
    created_by: str | None
    created_at: datetime
    updated_at: datetime
    memory_owner: str | None = None
    model: str | None = None
    check_spec: dict[str, Any] | None = None
    checklist: str | None = None
    idle_max_every: str | None = None
    check_failures_before_report: int | None = None
    topic: str | None = None

    def definition(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in DEFINITION_FIELDS}


@dataclass(frozen=True)
class JobRunRecord:
    id: int
    schedule_id: int
    scheduled_for: datetime
    started_at: datetime | None
    finished_at: datetime | None
    status: JobStatus
    origin: RunOrigin
    interactive: bool
    session_id: int | None
    run_id: int | None
    delivered: list[str]
    error: str | None
    tokens: int
    cost_nano_usd: int | None
    check_result: dict[str, Any] | None = None  # what the firing's check found (None: no check ran)


@dataclass(frozen=True)
class ScheduleState:
    """What a job's checks remember between firings (all empty before the first check)."""

    schedule_id: int
    output_hash: str | None = None
    etag: str | None = None
    last_modified: str | None = None
    failures: int = 0  # failed checks in a row
    failure_reported: bool = False  # this run of failures was told to deliver_to
    checklist_hash: str | None = None
    backoff_s: int | None = None  # the idle tick's stretched interval; None: its `every`
    last_woke_at: datetime | None = None
    updated_at: datetime | None = None
    topic_thread: str | None = None  # the thread key of the topic the job opened (`topic`)


STATE_FIELDS = frozenset(f for f in ScheduleState.__dataclass_fields__ if f not in ("schedule_id", "updated_at"))

# The statements of a firing, built once (building one costs more than running it on SQLite;
# a 1-minute tick runs them every minute). Bound names avoid column names, which update()
# reserves for the SET values that come with each execute.
_SCHEDULE_BY_ID = select(schedules).where(schedules.c.id == bindparam("schedule_key"))
_LOCK_SCHEDULE = select(schedules.c.id).where(schedules.c.id == bindparam("schedule_key")).with_for_update()
_RUNNING_OF = (
    select(job_runs.c.id)
    .where(job_runs.c.schedule_id == bindparam("schedule_key"), job_runs.c.status == "running")
    .order_by(job_runs.c.id)
    .limit(1)
)
_ADD_RUN = InsertIgnoring(job_runs, ["schedule_id", "scheduled_for"], returning=tuple(job_runs.c))
_RUN_BY_ID = select(job_runs).where(job_runs.c.id == bindparam("run_key"))
_CLOSE_RUN = (
    update(job_runs)
    .where(job_runs.c.id == bindparam("run_key"), job_runs.c.status == "running")
    .returning(*job_runs.c)
)
_SET_RUN = update(job_runs).where(job_runs.c.id == bindparam("run_key"))
_STATE_OF = select(schedule_states).where(schedule_states.c.schedule_id == bindparam("schedule_key"))
_SAVE_STATE = (
    update(schedule_states)
    .where(schedule_states.c.schedule_id == bindparam("schedule_key"))
    .returning(*schedule_states.c)
)
_ADD_STATE = InsertIgnoring(schedule_states, ["schedule_id"])


class ScheduleRepo(Repo):
    # Told (status, how many) after a job run is written with a status: the composition root
    # counts firings for /metrics (the scheduler package knows nothing of metrics).
    on_status: Callable[[str, int], None] | None = None

    def _told(self, status: str, count: int = 1) -> None:
        if self.on_status is not None and count:
            self.on_status(status, count)

    # ---- schedules -------------------------------------------------------------------------
    async def create(self, new: NewSchedule, *, now: datetime | None = None) -> ScheduleRecord:
        now = now or utcnow()

        def work(conn: Connection) -> ScheduleRecord:
            taken = conn.execute(select(schedules.c.id).where(schedules.c.name == new.name)).first()
            if taken is not None:
                raise ScheduleExists(f"a job named {new.name!r} already exists")
            schedule_id = conn.execute(
                insert(schedules).values(**asdict(new), created_at=now, updated_at=now).returning(schedules.c.id)
            ).scalar_one()
            row = conn.execute(select(schedules).where(schedules.c.id == schedule_id)).first()
            return to_record(ScheduleRecord, row)

        try:
            return await self.db.write(work)
        except IntegrityError as exc:  # the name's only other writer: another instance, a moment ago
            raise ScheduleExists(f"a job named {new.name!r} already exists") from exc

    async def update(self, schedule_id: int, *, now: datetime | None = None, **values: Any) -> ScheduleRecord | None:
        """Change fields; `updated_at` moves, which re-anchors intervals and the missed-run scan."""
        updated_at = now or utcnow()

        def work(conn: Connection) -> ScheduleRecord | None:
            conn.execute(update(schedules).where(schedules.c.id == schedule_id).values(**values, updated_at=updated_at))
            row = conn.execute(select(schedules).where(schedules.c.id == schedule_id)).first()
            return to_record(ScheduleRecord, row) if row else None

        return await self.db.write(work)

    async def set_enabled(
        self, schedule_id: int, enabled: bool, *, reason: str | None = None, now: datetime | None = None
    ) -> bool:
        """Switch a job on or off; False when it was already in that state (nothing changed)."""
        statement = (
            update(schedules)
            .where(schedules.c.id == schedule_id, schedules.c.enabled.is_(not enabled))
            .values(enabled=enabled, disabled_reason=None if enabled else reason, updated_at=now or utcnow())
        )
        return await self.db.write(lambda conn: conn.execute(statement).rowcount == 1)

    async def remove(self, schedule_id: int) -> bool:
        """Delete a job and its run history."""

        def work(conn: Connection) -> bool:
            conn.execute(delete(job_runs).where(job_runs.c.schedule_id == schedule_id))
            conn.execute(delete(schedule_states).where(schedule_states.c.schedule_id == schedule_id))
            return conn.execute(delete(schedules).where(schedules.c.id == schedule_id)).rowcount == 1

        return await self.db.write(work)

    async def get(self, schedule_id: int) -> ScheduleRecord | None:
        def work(conn: Connection) -> ScheduleRecord | None:
            row = conn.execute(_SCHEDULE_BY_ID, {"schedule_key": schedule_id}).first()
            return to_record(ScheduleRecord, row) if row else None

        return await self.db.read(work)

    async def by_name(self, name: str) -> ScheduleRecord | None:
        return await self._one_schedule(schedules.c.name == name)

    async def _one_schedule(self, condition: ColumnElement[bool]) -> ScheduleRecord | None:
        def work(conn: Connection) -> ScheduleRecord | None:
            row = conn.execute(select(schedules).where(condition)).first()
            return to_record(ScheduleRecord, row) if row else None

        return await self.db.read(work)

    async def list(
        self, *, enabled: bool | None = None, source: str | None = None, deliver_to: str | None = None
    ) -> list[ScheduleRecord]:
        query = select(schedules).order_by(schedules.c.name)
        if enabled is not None:
            query = query.where(schedules.c.enabled.is_(enabled))
        if source is not None:
            query = query.where(schedules.c.source == source)
        if deliver_to is not None:
            query = query.where(schedules.c.deliver_to == deliver_to)

        def work(conn: Connection) -> list[ScheduleRecord]:
            return [to_record(ScheduleRecord, r) for r in conn.execute(query).all()]

        return await self.db.read(work)

    async def fingerprint(self) -> int:
        """Changes anywhere (another instance, the CLI) show up as a different fingerprint."""
        query = select(schedules.c.id, schedules.c.enabled, schedules.c.updated_at).order_by(schedules.c.id)
        rows = await self.db.read(lambda conn: conn.execute(query).all())
        return hash(tuple((r.id, bool(r.enabled), r.updated_at) for r in rows))

    # ---- job runs --------------------------------------------------------------------------
    async def claim(
        self, schedule_id: int, scheduled_for: datetime, *, origin: RunOrigin = "schedule", now: datetime | None = None
    ) -> JobRunRecord | None:
        """Insert the firing's row: `running`, or `skipped` while an earlier run is still going.

        None when the firing was already claimed (by this or another scheduler)."""
        now = now or utcnow()
        claimed = await self.db.write(lambda conn: _claim(conn, schedule_id, scheduled_for, origin, now))
        if claimed is not None:
            self._told(claimed.status)
        return claimed

    async def claim_checked(
        self, schedule_id: int, scheduled_for: datetime, *, origin: RunOrigin = "schedule", now: datetime | None = None
    ) -> tuple[JobRunRecord | None, ScheduleState]:
        """`claim`, and what the job's checks remember, in the same transaction (a checked
        firing needs both before its check runs)."""
        now = now or utcnow()

        def work(conn: Connection) -> tuple[JobRunRecord | None, ScheduleState]:
            return _claim(conn, schedule_id, scheduled_for, origin, now), _state(conn, schedule_id)

        claimed, state = await self.db.write(work)
        if claimed is not None:
            self._told(claimed.status)
        return claimed, state

    async def record_missed(
        self, schedule_id: int, times: Sequence[datetime], *, error: str, now: datetime | None = None
    ) -> int:
        """One `missed` row per firing not already recorded; returns how many were new."""
        if not times:
            return 0
        now = now or utcnow()

        def work(conn: Connection) -> int:
            added = 0
            for when in times:
                result = conn.execute(
                    insert_ignoring(conn, job_runs, ["schedule_id", "scheduled_for"]).values(
                        schedule_id=schedule_id, scheduled_for=when, status="missed", origin="schedule",
                        interactive=False, delivered=[], tokens=0, finished_at=now, error=error,
                    )
                )
                added += result.rowcount
            return added

        added = await self.db.write(work)
        self._told("missed", added)
        return added

    async def attach_session(self, job_run_id: int, session_id: int) -> None:
        await self.db.write(
            lambda conn: conn.execute(update(job_runs).where(job_runs.c.id == job_run_id).values(session_id=session_id))
        )

    async def finish(
        self,
        job_run_id: int,
        *,
        status: JobStatus,
        error: str | None = None,
        run_id: int | None = None,
        tokens: int = 0,
        cost_nano_usd: int | None = None,
        check_result: dict[str, Any] | None = None,
        now: datetime | None = None,
    ) -> JobRunRecord | None:
        """Close a running job run (compare-and-set): None when it was no longer running."""
        values = closing(
            status=status, error=error, run_id=run_id, tokens=tokens, cost_nano_usd=cost_nano_usd,
            check_result=check_result, now=now,
        )
        finished = await self.db.write(lambda conn: _close(conn, job_run_id, values))
        if finished is not None:
            self._told(finished.status)
        return finished

    async def set_check_result(self, job_run_id: int, check_result: dict[str, Any]) -> None:
        """Record what the firing's check found on a run that goes on (it woke the model)."""
        await self.db.write(lambda conn: conn.execute(_SET_RUN, {"run_key": job_run_id, "check_result": check_result}))

    async def record_check(
        self,
        schedule_id: int,
        job_run_id: int,
        state: dict[str, Any],
        *,
        close: dict[str, Any] | None,
        check_result: dict[str, Any],
        now: datetime | None = None,
    ) -> tuple[ScheduleState, JobRunRecord | None]:
        """What a firing's check found, in one transaction: the job's check `state` saved (as
        `save_state`), and the run closed with `close` (`closing(...)`'s values, compare-and-set
        as `finish`) or, when the run goes on (the model wakes), `check_result` set on it.
        Returns the whole state and the closed run (None when not closed)."""
        stamp = _state_stamp(state, now)

        def work(conn: Connection) -> tuple[ScheduleState, JobRunRecord | None]:
            saved = _save_state(conn, schedule_id, stamp)
            if close is None:
                conn.execute(_SET_RUN, {"run_key": job_run_id, "check_result": check_result})
                return saved, None
            return saved, _close(conn, job_run_id, {**close, "check_result": check_result})

        saved, closed = await self.db.write(work)
        if closed is not None:
            self._told(closed.status)
        return saved, closed

    # ---- what checks remember between firings ------------------------------------------------
    async def state(self, schedule_id: int) -> ScheduleState:
        """The job's check state; an empty one before its first check."""
        return await self.db.read(lambda conn: _state(conn, schedule_id))

    async def save_state(self, schedule_id: int, *, now: datetime | None = None, **values: Any) -> ScheduleState:
        """Set some of the job's state fields (the rest keep their values); returns the whole state."""
        stamp = _state_stamp(values, now)
        return await self.db.write(lambda conn: _save_state(conn, schedule_id, stamp))

    async def note(self, job_run_id: int, error: str) -> None:
        """Remember something about a run (a kill request, a failed delivery) without closing it."""
        await self.db.write(
            lambda conn: conn.execute(update(job_runs).where(job_runs.c.id == job_run_id).values(error=error))
        )

    async def add_delivered(self, job_run_id: int, message_ids: Sequence[str]) -> None:
        def work(conn: Connection) -> None:
            current = conn.execute(select(job_runs.c.delivered).where(job_runs.c.id == job_run_id)).scalar()
            merged = list(current or []) + [m for m in message_ids if m not in (current or [])]
            conn.execute(update(job_runs).where(job_runs.c.id == job_run_id).values(delivered=merged))

        await self.db.write(work)

    async def get_run(self, job_run_id: int) -> JobRunRecord | None:
        def work(conn: Connection) -> JobRunRecord | None:
            row = conn.execute(_RUN_BY_ID, {"run_key": job_run_id}).first()
            return to_record(JobRunRecord, row) if row else None

        return await self.db.read(work)

    async def running(self, schedule_id: int | None = None) -> builtins.list[JobRunRecord]:
        query = select(job_runs).where(job_runs.c.status == "running").order_by(job_runs.c.id)
        if schedule_id is not None:
            query = query.where(job_runs.c.schedule_id == schedule_id)
        return await self._job_runs(query)

    async def recent_runs(self, schedule_id: int, *, limit: int = 20) -> builtins.list[JobRunRecord]:
        """Newest firings first."""
        query = (
            select(job_runs)
            .where(job_runs.c.schedule_id == schedule_id)
            .order_by(job_runs.c.scheduled_for.desc(), job_runs.c.id.desc())
            .limit(limit)
        )
        return await self._job_runs(query)

    async def _job_runs(self, query: Select) -> builtins.list[JobRunRecord]:
        def work(conn: Connection) -> list[JobRunRecord]:
            return [to_record(JobRunRecord, r) for r in conn.execute(query).all()]

        return await self.db.read(work)

    async def last_firing(self, schedule_id: int) -> datetime | None:
        """The latest firing of the trigger that has a record (manual runs and retries aside)."""
        query = (
            select(job_runs.c.scheduled_for)
            .where(job_runs.c.schedule_id == schedule_id, job_runs.c.origin == "schedule")
            .order_by(job_runs.c.scheduled_for.desc())
            .limit(1)
        )
        return await self.db.read(lambda conn: conn.execute(query).scalar())

    async def count_runs(self, schedule_id: int | None = None, *, status: str | None = None) -> int:
        query = select(func.count()).select_from(job_runs)
        if schedule_id is not None:
            query = query.where(job_runs.c.schedule_id == schedule_id)
        if status is not None:
            query = query.where(job_runs.c.status == status)
        return await self.db.read(lambda conn: int(conn.execute(query).scalar_one()))


def closing(
    *,
    status: JobStatus,
    error: str | None = None,
    run_id: int | None = None,
    tokens: int = 0,
    cost_nano_usd: int | None = None,
    check_result: dict[str, Any] | None = None,
    now: datetime | None = None,
) -> dict[str, Any]:
    """The values that close a job run (`finish`, `record_check`)."""
    values: dict[str, Any] = {"status": status, "finished_at": now or utcnow(), "tokens": tokens}
    if check_result is not None:
        values["check_result"] = check_result
    if error is not None:
        values["error"] = error
    if run_id is not None:
        values["run_id"] = run_id
    if cost_nano_usd is not None:
        values["cost_nano_usd"] = cost_nano_usd
    return values


def _claim(
    conn: Connection, schedule_id: int, scheduled_for: datetime, origin: RunOrigin, now: datetime
) -> JobRunRecord | None:
    # Claims of one schedule queue on its row, so the running check below sees the other
    # claimer's committed run (SQLite: BEGIN IMMEDIATE already serialises writes, and FOR
    # UPDATE would be a plain SELECT there: one statement a firing saved). The unique
    # (schedule_id, scheduled_for) decides which claim of a firing inserts.
    if conn.dialect.name != "sqlite":
        conn.execute(_LOCK_SCHEDULE, {"schedule_key": schedule_id})
    busy = conn.execute(_RUNNING_OF, {"schedule_key": schedule_id}).scalar()
    values: dict[str, Any] = dict(
        schedule_id=schedule_id, scheduled_for=scheduled_for, origin=origin, interactive=False, delivered=[], tokens=0,
        status="running", started_at=now, finished_at=None, error=None,
    )
    if busy is not None:
        values.update(status="skipped", started_at=None, finished_at=now, error=f"still running (job run #{busy})")
    row = conn.execute(_ADD_RUN.for_conn(conn), values).first()
    return to_record(JobRunRecord, row) if row is not None else None


def _close(conn: Connection, job_run_id: int, values: dict[str, Any]) -> JobRunRecord | None:
    # one statement: a 1-minute tick closes a run every minute
    row = conn.execute(_CLOSE_RUN, {**values, "run_key": job_run_id}).first()
    return to_record(JobRunRecord, row) if row is not None else None


def _state(conn: Connection, schedule_id: int) -> ScheduleState:
    row = conn.execute(_STATE_OF, {"schedule_key": schedule_id}).first()
    return to_record(ScheduleState, row) if row else ScheduleState(schedule_id=schedule_id)


def _state_stamp(values: dict[str, Any], now: datetime | None) -> dict[str, Any]:
    unknown = set(values) - STATE_FIELDS
    if unknown:
        raise TypeError(f"not schedule state fields: {sorted(unknown)}")
    return {**values, "updated_at": now or utcnow()}


def _save_state(conn: Connection, schedule_id: int, stamp: dict[str, Any]) -> ScheduleState:
    change = {**stamp, "schedule_key": schedule_id}
    row = conn.execute(_SAVE_STATE, change).first()  # one statement once the row exists
    if row is None:  # the first write (two instances at once: one inserts, both update)
        conn.execute(
            _ADD_STATE.for_conn(conn),
            {"schedule_id": schedule_id, "failures": 0, "failure_reported": False, "updated_at": stamp["updated_at"]},
        )
        row = conn.execute(_SAVE_STATE, change).first()
    return to_record(ScheduleState, row)
