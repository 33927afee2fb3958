"""Runs watched after their start: killed by an operator, past their timeout, left by a crash.

A run is stopped by sending "/stop" into its session, like a person would; it becomes
`canceled` (or stays `failed`, for a timeout) when its turn reports back. A run a crash left
`running` is failed and, within the misfire grace, fired once more.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from gateway.config import SchedulerConfig
from gateway.events import InboundMessage, Submit, ThreadKey
from gateway.store import Store
from gateway.store.schedules import JobRunRecord, ScheduleRecord, ScheduleRepo
from scheduler.outcomes import Outcomes
from scheduler.threads import SCHEDULER, run_thread

ONE_SHOT_DONE = "one-shot done"
RESTART_ERROR = "restart: the gateway stopped during the run"
HANDOFF_GRACE = timedelta(seconds=60)  # from the claim to the prompt entering the inbox


class Supervision:
    def __init__(
        self,
        store: Store,
        repo: ScheduleRepo,
        config: SchedulerConfig,
        *,
        submit: Submit,
        now: Callable[[], datetime],
        outcomes: Outcomes,
        grace: Callable[[ScheduleRecord], timedelta],
        retry: Callable[[int], Awaitable[object]],
    ) -> None:
        self.store = store
        self.repo = repo
        self.config = config
        self._submit = submit
        self._now = now
        self._outcomes = outcomes
        self._grace = grace
        self._retry = retry  # fires a schedule again now, as a retry

    async def kill(self, schedule: ScheduleRecord) -> list[JobRunRecord]:
        """Stop the job's running runs.

        A run whose prompt is still queued is dropped and closed `canceled` here; a run in
        progress gets "/stop" and becomes `canceled` when its turn reports back."""
        runs = await self.repo.running(schedule.id)
        for run in runs:
            thread = await self._thread_of(schedule, run)
            item = await self.store.inbox.get_by_event(f"job:{run.id}")
            if (
                item is not None
                and item.status in ("pending", "held")
                and await self.store.inbox.drop_pending(str(thread))
            ):
                await self.repo.finish(run.id, status="canceled", error="killed before it started", now=self._now())
                continue
            await self.repo.note(run.id, "killed by operator")
            await self._send_stop(thread, f"job:{run.id}:kill:{int(self._now().timestamp() * 1e6)}")
        return runs

    async def check_timeouts(self) -> list[JobRunRecord]:
        """Runs past their timeout become `failed` (timeout) and their session gets "/stop"."""
        now, stopped = self._now(), []
        for run in await self.repo.running():
            schedule = await self.repo.get(run.schedule_id)
            limit = schedule.timeout_s if schedule and schedule.timeout_s else self.config.timeout
            if schedule is None or run.started_at is None or now - run.started_at < timedelta(seconds=limit):
                continue
            closed = await self.repo.finish(
                run.id, status="failed", error=f"timeout: still running after {int(limit)}s", now=now
            )
            if closed is None:
                continue
            await self._send_stop(await self._thread_of(schedule, run), f"job:{run.id}:timeout")
            await self._outcomes.notify_failure(schedule, closed)
            stopped.append(closed)
        return stopped

    async def _thread_of(self, schedule: ScheduleRecord, run: JobRunRecord) -> ThreadKey:
        session = await self.store.sessions.get(run.session_id) if run.session_id else None
        return ThreadKey.parse(session.thread_key) if session else run_thread(schedule, run.id)

    async def _send_stop(self, thread: ThreadKey, event_id: str) -> None:
        await self._submit([InboundMessage(thread=thread, sender=SCHEDULER, text="/stop", event_id=event_id)])

    # ---- restart ---------------------------------------------------------------------------
    async def close_abandoned_runs(self) -> list[JobRunRecord]:
        """Runs left `running` by a crash become `failed` (restart); within the grace the job
        runs once more in a fresh session. Runs the core will still finish are left alone: the
        prompt is queued, a worker holds the thread, or an interrupted turn will be continued."""
        recovered = []
        for run in await self.repo.running():
            schedule = await self.repo.get(run.schedule_id)
            if schedule is None or await self._still_alive(schedule, run):
                continue
            closed = await self.repo.finish(run.id, status="failed", error=RESTART_ERROR, now=self._now())
            if closed is None:
                continue
            recovered.append(closed)
            wanted = schedule.enabled or schedule.disabled_reason == ONE_SHOT_DONE
            if wanted and self._now() - run.scheduled_for <= self._grace(schedule):
                await self._retry(schedule.id)
            else:
                await self._outcomes.notify_failure(schedule, closed)
        return recovered

    async def _still_alive(self, schedule: ScheduleRecord, run: JobRunRecord) -> bool:
        run = await self.repo.get_run(run.id) or run  # the claimer may have moved it on meanwhile
        item = await self.store.inbox.get_by_event(f"job:{run.id}")
        # a check runs between the claim and the prompt: its timeout is part of the hand-off
        handoff = HANDOFF_GRACE + timedelta(seconds=int((schedule.check_spec or {}).get("timeout_s") or 0))
        young = run.started_at is not None and self._now() - run.started_at < handoff
        if item is None and young:
            return True  # just claimed (by this or another instance): its prompt is on its way
        if item is not None and item.status in ("pending", "held"):
            return True  # its prompt is still queued: the core will run it
        if run.session_id is not None:
            turns = await self.store.runs.list(session_id=run.session_id, limit=5)
            if any(turn.stage in ("RUNNING", "AWAITING_INPUT") for turn in turns):
                return True  # an interrupted turn: the core continues it and reports the end
        thread = await self._thread_of(schedule, run)
        return await self.store.inbox.lease_holder(f"thread:{thread}") is not None
