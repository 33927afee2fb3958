"""Schedules -> runs: the clock's plan, missed firings, claims and ephemeral sessions.

A firing is claimed once in `job_runs`, then becomes an ephemeral, non-interactive session
whose prompt enters the inbox like any message (sender "scheduler"). The core runs the turn
(approvals auto-denied) and reports `TurnEnded`; `on_turn_ended` (`outcomes.py`) closes the
run and delivers the outcome; `supervision.py` stops runs (kill, timeout) and recovers those a
crash left. Every firing leaves a row: running, success, failed, canceled, skipped, missed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from gateway.config import SchedulerConfig
from gateway.events import InboundMessage, Submit, TurnEnded, utcnow
from gateway.store import Store
from gateway.store.schedules import JobRunRecord, RunOrigin, ScheduleRecord, ScheduleRepo, ScheduleState, closing
from scheduler.backoff import IdleBackoff
from scheduler.checklist import ChecklistGate, ChecklistReading, ReadChecklist, checklist_block
from scheduler.checks import CHECK_FAILED, NO_CHANGE, CheckOutcome, Prober, next_state, run_check, with_check_output
from scheduler.clock import Clock, ManualClock
from scheduler.delivery import BUDGET_PREFIX, job_text
from scheduler.outcomes import Deliver, OpenTopic, Outcomes
from scheduler.supervision import ONE_SHOT_DONE, Supervision
from scheduler.sync import SyncReport, sync_config
from scheduler.threads import SCHEDULER, job_run_id_of, run_thread, session_kind
from scheduler.triggers import LATE_OK, TriggerError, catch_up, timetable

log = logging.getLogger(__name__)

MAX_CONCURRENT_FIRINGS = 8  # a burst (many jobs at 09:00) queues here, not on the connection pool


def schedule_repo(store: Store) -> ScheduleRepo:
    """The store's schedule repository."""
    return store.schedules


class Scheduler:
    def __init__(
        self,
        store: Store,
        config: SchedulerConfig,
        *,
        submit: Submit,
        deliver: Deliver,
        open_topic: OpenTopic | None = None,
        now: Callable[[], datetime] | None = None,
        room_for_job: Callable[[int], Awaitable[str | None]] | None = None,
        checks: Prober | None = None,
        manual_clock: bool = False,
        read_checklist: ReadChecklist | None = None,
    ):
        self.store = store
        self.config = config
        self.repo = schedule_repo(store)
        self._submit = submit
        self._now = now or utcnow
        self._room_for_job = room_for_job  # why a job's spend caps leave no room (None: room)
        self.checks = checks  # runs the jobs' checks (gateway/jobs/checks.py); None: a check fails, saying so
        self.checklists = ChecklistGate(self.repo, read_checklist)  # read_checklist None: every checklist is empty
        # manual: the caller runs each planned firing itself (tests, benchmarks with their own time)
        self._clock: Clock | ManualClock = (
            ManualClock(self._on_due, self.housekeeping)
            if manual_clock
            else Clock(self._on_due, self.housekeeping, housekeeping_s=config.poll_interval)
        )
        # Planning and firing one schedule never interleave; different schedules run freely.
        self._locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._reload_lock = asyncio.Lock()
        self._firing = asyncio.Semaphore(MAX_CONCURRENT_FIRINGS)
        self._fingerprint: int | None = None
        self._dirty = False
        self.outcomes = Outcomes(store, self.repo, deliver, self._now, open_topic)
        self.backoff = IdleBackoff(self.repo)
        self.supervision = Supervision(
            store, self.repo, config, submit=submit, now=self._now, outcomes=self.outcomes, grace=self._grace,
            retry=lambda schedule_id: self.fire(schedule_id, self._now(), origin="retry"),
        )

    @property
    def clock(self) -> Clock | ManualClock:
        return self._clock

    # ---- lifecycle (the leader) ------------------------------------------------------------
    async def sync_config_jobs(self) -> SyncReport:
        report = await sync_config(self.repo, self.config, self._now())
        if report.changed:
            await self.reload()
        return report

    async def start(self) -> None:
        """Become the clock: recover crashed runs, catch up on missed firings, plan the rest."""
        if not self.config.enabled or self._clock.running:
            return
        self._clock.start()
        await self.close_abandoned_runs()
        await self.reload()

    async def stop(self) -> None:
        self._clock.stop()

    async def reload(self) -> None:
        """Rebuild the clock from the table (only where the clock runs)."""
        if not self._clock.running:
            return
        async with self._reload_lock:
            self._fingerprint = await self.repo.fingerprint()
            self._dirty = False
            schedules = await self.repo.list()
            enabled = {s.id for s in schedules if s.enabled}
            for gone in set(self._clock.planned()) - enabled:
                self._clock.unplan(gone)
            for schedule in schedules:
                async with self._locks[schedule.id]:
                    await self._plan(schedule)

    async def housekeeping(self) -> None:
        """Periodic: pick up changes made elsewhere, stop runs past their timeout."""
        if self._dirty or await self.repo.fingerprint() != self._fingerprint:
            await self.reload()
        await self.check_timeouts()
        await self.close_abandoned_runs()  # runs a dead instance left behind, once their grace is over

    async def _on_due(self, schedule_id: int, when: datetime) -> None:
        async with self._locks[schedule_id]:
            try:
                async with self._firing:
                    schedule, run = await self._fire(schedule_id, when, "schedule")
                if schedule is None or schedule.kind == "at":  # gone, or a one-shot its firing switched off
                    schedule = await self.repo.get(schedule_id)
                if schedule is None:
                    self._clock.unplan(schedule_id)
                else:
                    await self.backoff.after_firing(schedule, run)
                    # the firing just recorded is the latest: no need to read it back
                    await self._plan(schedule, last=when if run is not None and run.origin == "schedule" else None)
            except Exception:  # not handled here: marked, then raised to the clock's catch
                self._dirty = True  # re-plan everything at the next housekeeping
                raise

    async def _plan(self, schedule: ScheduleRecord, *, last: datetime | None = None) -> None:
        """Record what was missed, run what is due, and wait for the next firing (`last`: the
        latest firing recorded, when the caller knows it)."""
        if not schedule.enabled:
            self._clock.unplan(schedule.id)
            return
        now = self._now()
        try:
            table = timetable(
                schedule.kind,
                schedule.spec,
                schedule.timezone,
                anchor=schedule.updated_at,
                active_hours=schedule.active_hours,
            )
        except TriggerError as exc:
            log.error("job %s cannot be scheduled: %s", schedule.name, exc)
            self._clock.unplan(schedule.id)
            return
        last = last or await self.repo.last_firing(schedule.id)
        since = max(last, schedule.updated_at) if last else schedule.updated_at
        idle_interval = await self.backoff.current(schedule, last)
        if idle_interval is not None and last is not None:  # an idle job's stretched pace, from its last firing
            table = self.backoff.timetable(schedule, idle_interval, last)
        plan = catch_up(table, since=since, now=now, misfire=schedule.misfire, grace=self._grace(schedule))
        await self._record_missed(schedule, plan.missed, plan.uncounted, plan.truncated, since)
        if plan.due is not None:
            await self.backoff.after_firing(schedule, await self.fire(schedule.id, plan.due))
        elif plan.missed and schedule.kind == "at":
            await self.repo.set_enabled(schedule.id, False, reason="one-shot missed", now=now)
        if plan.next is not None:
            self._clock.plan(schedule.id, plan.next)
        else:
            self._clock.unplan(schedule.id)

    async def _record_missed(
        self, schedule: ScheduleRecord, missed: tuple[datetime, ...], uncounted: int, truncated: bool, since: datetime
    ) -> None:
        if not missed:
            return
        why = "missed: the gateway was not running" + (
            " (misfire: skip)" if schedule.misfire == "skip" else f" (older than misfire_grace {self._grace(schedule)})"
        )
        first, rest = missed[0], missed[1:]
        first_why = why
        if uncounted:
            more = "at least " if truncated else ""
            first_why = (
                f"{why}; {more}{uncounted} earlier firings since {since.isoformat(timespec='seconds')} also missed"
            )
        await self.repo.record_missed(schedule.id, [first], error=first_why, now=self._now())
        await self.repo.record_missed(schedule.id, rest, error=why, now=self._now())
        log.warning("job %s: %d firing(s) missed while the gateway was down", schedule.name, len(missed) + uncounted)

    def _grace(self, schedule: ScheduleRecord) -> timedelta:
        seconds = schedule.misfire_grace_s if schedule.misfire_grace_s is not None else self.config.misfire_grace
        return timedelta(seconds=seconds)

    def _allowed_lateness(self, schedule: ScheduleRecord) -> timedelta:
        return max(LATE_OK, self._grace(schedule)) if schedule.misfire == "run_once" else LATE_OK

    # ---- firing ----------------------------------------------------------------------------
    async def fire(
        self, schedule_id: int, scheduled_for: datetime, *, origin: RunOrigin = "schedule"
    ) -> JobRunRecord | None:
        """Claim the firing once and start its run; None when there is nothing to do
        (claimed elsewhere, job gone or disabled, or too late: then it is recorded `missed`)."""
        async with self._firing:
            return (await self._fire(schedule_id, scheduled_for, origin))[1]

    async def _fire(
        self, schedule_id: int, scheduled_for: datetime, origin: RunOrigin
    ) -> tuple[ScheduleRecord | None, JobRunRecord | None]:
        """`fire`, with the job as read at its start (None: gone)."""
        now = self._now()
        schedule = await self.repo.get(schedule_id)
        if schedule is None or (origin == "schedule" and not schedule.enabled):
            return schedule, None
        if origin == "schedule" and now - scheduled_for > self._allowed_lateness(schedule):
            late = int((now - scheduled_for).total_seconds())
            await self.repo.record_missed(
                schedule.id, [scheduled_for], error=f"missed: due {late}s ago, beyond the misfire allowance", now=now
            )
            await self._close_one_shot(schedule, "one-shot missed")
            return schedule, None
        state: ScheduleState | None = None
        if schedule.check_spec is not None:  # its check needs what the last one found: read with the claim
            run, state = await self.repo.claim_checked(schedule.id, scheduled_for, origin=origin, now=now)
        else:
            run = await self.repo.claim(schedule.id, scheduled_for, origin=origin, now=now)
        if run is None:
            return schedule, None
        if origin == "schedule":
            await self._close_one_shot(schedule, ONE_SHOT_DONE)
        if run.status != "running":
            log.info("job %s: firing at %s skipped (%s)", schedule.name, scheduled_for.isoformat(), run.error)
            return schedule, run
        looked = await self._look_first(schedule, run, state)  # claimed first: one instance looks, once per firing
        if isinstance(looked, JobRunRecord) or looked is None:  # closed (None: by someone else meanwhile)
            return schedule, looked if looked is not None else await self.repo.get_run(run.id)
        check, checklist = looked
        full = await self._room_for_job(schedule.id) if self._room_for_job is not None else None
        if full:
            log.info("job %s: firing at %s skipped at a spend cap: %s", schedule.name, scheduled_for.isoformat(), full)
            closed = await self.repo.finish(run.id, status="skipped", error=f"{BUDGET_PREFIX}{full}", now=self._now())
            await self.outcomes.notify_skipped(schedule, run.id, closed)
            return schedule, closed
        return schedule, await self._start_run(schedule, run, check, checklist)

    async def _look_first(
        self, schedule: ScheduleRecord, run: JobRunRecord, state: ScheduleState | None = None
    ) -> tuple[CheckOutcome | None, ChecklistReading | None] | JobRunRecord | None:
        """The job's check and a tick's checklist, before any session: what the model is given,
        or the firing's run closed (nothing new, or the check failed; None when it was no longer
        running). A checklist with open items not yet answered wakes the model even when the
        check found nothing. `state`: the job's check state, when the caller read it."""
        checklist = self.checklists.reading(schedule)
        fresh = await self.checklists.wakes(schedule, run, checklist)
        check: CheckOutcome | None = None
        if schedule.check_spec is not None:
            found = await self.check_firing(schedule, run, checklist_wakes=fresh, state=state)
            if not isinstance(found, CheckOutcome):
                return found
            check = found
        elif checklist is not None and not fresh:
            return await self.checklists.skip(run, checklist, self._now())
        if checklist is not None:
            await self.checklists.note(run, checklist, check.record() if check is not None else None)
        return check, checklist

    async def check_firing(
        self,
        schedule: ScheduleRecord,
        run: JobRunRecord,
        *,
        checklist_wakes: bool = False,
        state: ScheduleState | None = None,
    ) -> CheckOutcome | JobRunRecord | None:
        """Run the job's check for a claimed firing and remember what it found (the state and
        the run in one transaction): the outcome when the model wakes, else the run closed
        (`skipped`, "no change"; or `failed`, the failure told to deliver_to once at the job's
        count of failures in a row), None when it was no longer running. `state`: the job's
        check state, when the caller read it with the claim."""
        if state is None:
            state = await self.repo.state(schedule.id)
        if self.checks is None:
            check = CheckOutcome(wake=False, error="checks do not run in this process")
        else:
            check = await run_check(schedule, state, self.checks)
        if run.origin == "manual" and check.error is None:
            check = replace(check, wake=True)  # run-now: the person asked for the model
        after = schedule.check_failures_before_report or self.config.check_failures_before_report
        values, tell = next_state(state, check, report_after=after)
        now = self._now()
        if check.wake or (checklist_wakes and check.error is None):
            values["last_woke_at"] = now
        close = run_closing(check, checklist_wakes, now)
        # nothing new from the check but new items on the checklist: the model wakes (no
        # check_result on the run then: the checklist's note records the firing)
        if close is None and not check.wake:
            await self.repo.save_state(schedule.id, now=now, **values)
            return check
        state, closed = await self.repo.record_check(
            schedule.id, run.id, values, close=close, check_result=check.record(), now=now
        )
        if close is None:
            return check
        if check.error is None:
            log.debug("job %s: check found no change; no session", schedule.name)
            return closed
        log.warning("job %s: check failed (%d in a row): %s", schedule.name, state.failures, check.error)
        if closed is not None and tell:
            await self.outcomes.notify_check_failure(schedule, closed, state.failures, check.error or "")
        return closed

    async def run_now(self, name: str) -> JobRunRecord | None:
        """A manual firing (its own scheduled_for: now). None when there is no such job."""
        schedule = await self.repo.by_name(name)
        if schedule is None:
            return None
        return await self.fire(schedule.id, self._now(), origin="manual")

    async def _close_one_shot(self, schedule: ScheduleRecord, reason: str) -> None:
        if schedule.kind == "at" and schedule.enabled:
            await self.repo.set_enabled(schedule.id, False, reason=reason, now=self._now())

    async def _start_run(
        self,
        schedule: ScheduleRecord,
        run: JobRunRecord,
        check: CheckOutcome | None = None,
        checklist: ChecklistReading | None = None,
    ) -> JobRunRecord | None:
        thread = run_thread(schedule, run.id)
        kind = session_kind(schedule)
        try:
            session = await self.store.sessions.open(
                str(thread), source=kind, kind=kind, interactive=False, ephemeral=True, schedule_id=schedule.id,  # type: ignore[arg-type]
                max_rounds=schedule.max_rounds, max_tokens=schedule.max_tokens, model=schedule.model, fresh=True,
            )
            await self.repo.attach_session(run.id, session.id)
            text = job_text(schedule)
            if checklist is not None and not checklist.empty:  # after the job's words, before the check's output
                text = f"{text}\n\n{checklist_block(checklist)}"
            if check is not None and check.wake:
                text = with_check_output(text, check, schedule.check_spec or {})
            message = InboundMessage(thread=thread, sender=SCHEDULER, text=text, event_id=f"job:{run.id}")
            await self._submit([message])
        except Exception as exc:  # whatever stopped the start is recorded as the run's failure
            log.exception("job %s: run %s could not start", schedule.name, run.id)
            closed = await self.repo.finish(run.id, status="failed", error=f"could not start: {exc}", now=self._now())
            if closed is not None:
                await self.outcomes.notify_failure(schedule, closed)
            return closed
        return await self.repo.get_run(run.id)

    # ---- outcomes and supervision (outcomes.py, supervision.py) -------------------------------
    async def on_turn_ended(self, event: TurnEnded) -> None:
        """Close the job run of a scheduled session's turn and deliver its outcome."""
        await self.outcomes.on_turn_ended(event)
        job_run_id = job_run_id_of(event.thread)
        if job_run_id is not None and event.stage == "SUCCESS":  # a tick's checklist is then answered
            run = await self.repo.get_run(job_run_id)
            if run is not None:
                await self.checklists.answered(run)

    async def kill(self, name: str) -> list[JobRunRecord] | None:
        """Stop the job's running runs; None when there is no such job."""
        schedule = await self.repo.by_name(name)
        if schedule is None:
            return None
        return await self.supervision.kill(schedule)

    async def check_timeouts(self) -> list[JobRunRecord]:
        """Runs past their timeout become `failed` (timeout) and their session gets "/stop"."""
        return await self.supervision.check_timeouts()

    async def close_abandoned_runs(self) -> list[JobRunRecord]:
        """Runs a crash left `running` become `failed`, and run once more within the grace."""
        return await self.supervision.close_abandoned_runs()


def run_closing(check: CheckOutcome, checklist_wakes: bool, now: datetime) -> dict[str, Any] | None:
    """How a checked firing's run closes (`closing` values), or None when the model wakes."""
    if check.error is not None:
        return closing(status="failed", error=CHECK_FAILED + check.error, now=now)
    if not check.wake and not checklist_wakes:
        return closing(status="skipped", error=NO_CHANGE, now=now)
    return None
