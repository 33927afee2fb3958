"""Child agents of the `delegate` tool: their rows, their sessions, and background task items.

A task row links a child session (and its current run) to the parent's session, run and tool
call. Creating the tasks of one call is idempotent (unique on the call and the task's place):
a turn that continues after a restart finds the rows it made before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.engine import Connection

from gateway.events import ThreadKey, utcnow
from gateway.store.base import Fence, Repo, check_fence, to_record
from gateway.store.inbox import InboxRepo, NewItem
from gateway.store.items import StartTask
from gateway.store.records import MessageRecord, RunRecord
from gateway.store.runs import RunRepo
from gateway.store.sessions import SessionRepo
from gateway.store.tables import delegations, runs, sessions

_D = delegations.c
FINISHED = ("done", "failed", "canceled")


@dataclass(frozen=True)
class TaskRecord:
    id: int
    parent_session_id: int
    parent_run_id: int | None
    parent_tool_call_id: int
    ordinal: int
    thread_key: str
    child_session_id: int  # set in the transaction that creates the row
    child_run_id: int | None
    name: str
    prompt: str
    tools: list[str]
    depth: int
    background: bool
    status: str  # pending | running | suspended (by a shutdown) | done | failed | canceled
    result: str | None
    reported: bool
    created_at: datetime
    finished_at: datetime | None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @property
    def task_thread(self) -> str:
        """The inbox thread of a background task (its own lease, any instance)."""
        return task_thread_key(self.id)


@dataclass(frozen=True)
class NewTask:
    name: str
    prompt: str
    tools: tuple[str, ...]


@dataclass(frozen=True)
class ChildSession:
    """What a child session copies from its parent."""

    source: str
    interactive: bool
    started_by: str
    max_rounds: int | None
    max_tokens: int | None
    schedule_id: int | None = None  # a scheduled run's job: its caps count the children's calls
    model: str | None = None  # the parent's model (a name of llm.models; None: the default)


TASK_CHANNEL = "task"  # the channel part of a background task's thread key


def task_item(task_id: int) -> NewItem:
    return StartTask(task_id).item(task_thread_key(task_id))


def task_thread_key(task_id: int) -> str:
    """A background task's thread ("task:<id>:")."""
    return ThreadKey.format(TASK_CHANNEL, str(task_id))


class DelegationRepo(Repo):
    async def create(
        self,
        *,
        parent_session_id: int,
        parent_run_id: int,
        parent_tool_call_id: int,
        thread_key: str,
        tasks: Sequence[NewTask],
        depth: int,
        background: bool,
        child: ChildSession,
        fence: Fence | None = None,
    ) -> list[TaskRecord]:
        """The tasks of one delegate call with their child sessions (and, for background tasks,
        their inbox items), in one transaction; the existing rows when they were made before."""

        def work(conn: Connection) -> list[TaskRecord]:
            existing = _for_call(conn, parent_tool_call_id)
            if existing:
                return existing
            check_fence(conn, fence)
            now = utcnow()
            items = []
            for ordinal, task in enumerate(tasks):
                task_id = conn.execute(
                    insert(delegations)
                    .values(
                        parent_session_id=parent_session_id,
                        parent_run_id=parent_run_id,
                        parent_tool_call_id=parent_tool_call_id,
                        ordinal=ordinal,
                        thread_key=thread_key,
                        name=task.name,
                        prompt=task.prompt,
                        tools=list(task.tools),
                        depth=depth,
                        background=background,
                        status="pending",
                        reported=False,
                        created_at=now,
                    )
                    .returning(_D.id)
                ).scalar_one()
                session_id = conn.execute(
                    insert(sessions)
                    .values(
                        thread_key=task_thread_key(task_id) if background else thread_key,
                        kind="child",
                        interactive=child.interactive,
                        ephemeral=True,
                        source=child.source,
                        started_by=child.started_by,
                        max_rounds=child.max_rounds,
                        max_tokens=child.max_tokens,
                        schedule_id=child.schedule_id,
                        model=child.model,
                        next_seq=1,
                        notes={},
                        created_at=now,
                    )
                    .returning(sessions.c.id)
                ).scalar_one()
                conn.execute(update(delegations).where(_D.id == task_id).values(child_session_id=session_id))
                if background:
                    items.append(task_item(task_id))
            for item in items:
                InboxRepo.add_in(conn, item)
            return _for_call(conn, parent_tool_call_id)

        return await self.db.write(work)

    async def for_call(self, tool_call_id: int) -> list[TaskRecord]:
        return await self.db.read(lambda conn: _for_call(conn, tool_call_id))

    async def get(self, task_id: int) -> TaskRecord | None:
        return await self.db.read(lambda conn: _one(conn, _D.id == task_id))

    async def by_child_session(self, session_id: int) -> TaskRecord | None:
        return await self.db.read(lambda conn: _one(conn, _D.child_session_id == session_id))

    async def of_session(self, session_id: int, *, open_only: bool = False) -> list[TaskRecord]:
        """The tasks a session started (directly), oldest first."""

        def work(conn: Connection) -> list[TaskRecord]:
            query = select(delegations).where(_D.parent_session_id == session_id).order_by(_D.id)
            if open_only:
                query = query.where(_D.status.in_(("pending", "running", "suspended")))
            return [_record(r) for r in conn.execute(query)]

        return await self.db.read(work)

    async def sync_child_sessions(self, session_ids: Sequence[int]) -> set[int]:
        """Which of these sessions are children running inside their parent's turn."""
        if not session_ids:
            return set()

        def work(conn: Connection) -> set[int]:
            rows = conn.execute(
                select(_D.child_session_id).where(_D.child_session_id.in_(list(session_ids)), _D.background.is_(False))
            )
            return {r.child_session_id for r in rows}

        return await self.db.read(work)

    async def begin(
        self, task: TaskRecord, *, model: str | None, fence: Fence | None = None, item_id: int | None = None,
        voices: Sequence[dict[str, str]] = (),
    ) -> tuple[RunRecord, MessageRecord]:
        """A child's first turn: its run, the task as its user row, the task marked running on
        that run and (`item_id`) the inbox item that started it done, in one transaction: a
        crash before it leaves the item pending, to start the task again. `voices`: other
        people's words its parent's turn held (gateway/agent/voices.py), kept on the row."""

        def work(conn: Connection) -> tuple[RunRecord, MessageRecord]:
            if item_id is not None:
                check_fence(conn, fence)
                InboxRepo.finish_in(conn, InboxRepo.finish_params([item_id]))
            run = RunRepo.start_in(
                conn, task.child_session_id, task.task_thread if task.background else task.thread_key, model=model
            )
            row = SessionRepo.append_in(
                conn,
                task.child_session_id,
                "user",
                task.prompt,
                sender_id="delegate",
                sender_name=task.name,
                run_id=run.id,
                fence=fence,
                voices=voices,
            )
            conn.execute(update(delegations).where(_D.id == task.id).values(status="running", child_run_id=run.id))
            return run, row

        return await self.db.write(work)

    async def restart(self, task: TaskRecord, old_run_id: int, *, model: str | None) -> RunRecord:
        """A child whose worker died continues in a new run (the old one is closed as FAILED)."""

        def work(conn: Connection) -> RunRecord:
            RunRepo.add_events_in(
                conn,
                old_run_id,
                [
                    (
                        "RUN_ERROR",
                        {
                            "stage": "restart",
                            "message": "the worker running this child stopped; continuing in a new run",
                        },
                        None,
                    )
                ],
            )
            RunRepo.set_stage_in(conn, old_run_id, "FAILED", end_reason="error", error="restart")
            run = RunRepo.start_in(
                conn, task.child_session_id, task.task_thread if task.background else task.thread_key, model=model
            )
            conn.execute(update(delegations).where(_D.id == task.id).values(status="running", child_run_id=run.id))
            return run

        return await self.db.write(work)

    async def set_status(self, task_id: int, status: str) -> None:
        await self.db.write(
            lambda conn: conn.execute(
                update(delegations).where(_D.id == task_id, _D.status.notin_(FINISHED)).values(status=status)
            )
        )

    async def set_parent_run(self, task_ids: Sequence[int], run_id: int) -> None:
        """The parent continues in a new run after a restart: its children now belong to it."""
        if task_ids:
            await self.db.write(
                lambda conn: conn.execute(
                    update(delegations).where(_D.id.in_(list(task_ids))).values(parent_run_id=run_id)
                )
            )

    async def cancel_pending(self, task_id: int, result: str, *, report: NewItem | None = None) -> bool:
        """pending -> canceled (a background task stopped before it started)."""

        def work(conn: Connection) -> bool:
            changed = conn.execute(
                update(delegations)
                .where(_D.id == task_id, _D.status == "pending")
                .values(status="canceled", result=result, finished_at=utcnow(), reported=report is not None)
            ).rowcount
            if changed and report is not None:
                InboxRepo.add_in(conn, report)
            return bool(changed)

        return await self.db.write(work)

    async def finish(
        self, task: TaskRecord, status: str, result: str, *, charge_run: int | None, report: NewItem | None = None
    ) -> bool:
        """Record a child's end once (False when it had already ended), in one transaction with
        what it cost, added to `charge_run` (the parent's run), and, for a background task, its
        report queued to the parent's thread."""

        def work(conn: Connection) -> bool:
            changed = conn.execute(
                update(delegations)
                .where(_D.id == task.id, _D.status.notin_(FINISHED))
                .values(status=status, result=result, finished_at=utcnow(), reported=report is not None)
            ).rowcount
            if not changed:
                return False
            if charge_run is not None:
                totals = _child_totals(conn, task.child_session_id)
                RunRepo.add_events_in(
                    conn,
                    charge_run,
                    [("CHILD_RUN", {"task_id": task.id, "name": task.name, "status": status, **totals}, None)],
                    **totals,
                )
            if report is not None:
                InboxRepo.add_in(conn, report)
            return True

        return await self.db.write(work)

    async def tree(self, run_id: int) -> list[tuple[int, TaskRecord]]:
        """The tasks under a run, depth first: (level, task), level 1 for its own children."""

        def work(conn: Connection) -> list[tuple[int, TaskRecord]]:
            out: list[tuple[int, TaskRecord]] = []

            def walk(parent_run: int, level: int) -> None:
                for row in conn.execute(select(delegations).where(_D.parent_run_id == parent_run).order_by(_D.id)):
                    task = _record(row)
                    out.append((level, task))
                    child_runs = conn.execute(
                        select(runs.c.id).where(runs.c.session_id == task.child_session_id).order_by(runs.c.id)
                    )
                    for child_run in child_runs.scalars().all():
                        walk(child_run, level + 1)

            walk(run_id, 1)
            return out

        return await self.db.read(work)


_CHARGED = (
    "input_tokens", "cached_tokens", "cache_write_tokens", "output_tokens", "reasoning_tokens", "llm_calls",
    "tool_calls",
)


def _child_totals(conn: Connection, session_id: int) -> dict[str, Any]:
    """Everything the child's runs used (a child may have run in several after restarts);
    its own children's use is already in those runs."""
    columns = [func.coalesce(func.sum(getattr(runs.c, name)), 0).label(name) for name in _CHARGED]
    row = conn.execute(
        select(*columns, func.sum(runs.c.cost_nano_usd).label("cost_nano_usd")).where(runs.c.session_id == session_id)
    ).one()
    totals = {name: int(getattr(row, name)) for name in _CHARGED}
    if row.cost_nano_usd is not None:
        totals["cost_nano_usd"] = int(row.cost_nano_usd)
    return totals


def _record(row: Any) -> TaskRecord:
    return to_record(TaskRecord, row)


def _one(conn: Connection, condition: Any) -> TaskRecord | None:
    row = conn.execute(select(delegations).where(condition)).first()
    return _record(row) if row is not None else None


def _for_call(conn: Connection, tool_call_id: int) -> list[TaskRecord]:
    rows = conn.execute(select(delegations).where(_D.parent_tool_call_id == tool_call_id).order_by(_D.ordinal))
    return [_record(r) for r in rows]
