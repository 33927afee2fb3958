"""Schedules -> runs: claims, ephemeral sessions, outcomes, missed firings and recovery.

A firing is claimed once in `job_runs`, then becomes an ephemeral, non-interactive session
whose prompt enters the inbox like any message (sender "scheduler"). The core runs the turn
(approvals auto-denied) and reports `TurnEnded`; `on_turn_ended` closes the run and delivers
the outcome. Every firing leaves a row: running, success, failed, canceled, skipped, missed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

from gateway.config import SchedulerConfig
from gateway.events import Delivered, InboundMessage, Outbound, Prompt, Sender, Submit, ThreadKey, TurnEnded, utcnow
from gateway.store import Store
from gateway.store.schedules import JobRunRecord, RunOrigin, ScheduleRecord, ScheduleRepo
from scheduler.clock import Clock
from scheduler.definitions import DefinitionError, parse_deliver_to
from scheduler.delivery import (
    BUDGET_PREFIX,
    failure_message,
    failure_text,
    job_text,
    plan_outcome,
    rerun_notice,
    result_message,
    skipped_text,
)
from scheduler.sync import SyncReport, sync_config
from scheduler.triggers import LATE_OK, TriggerError, catch_up, timetable

log = logging.getLogger(__name__)

Deliver = Callable[[Outbound | Prompt], Awaitable[Delivered]]
SCHEDULER = Sender("scheduler", "scheduler")
STATUS_BY_STAGE = {"SUCCESS": "success", "FAILED": "failed", "CANCELED": "canceled"}
ONE_SHOT_DONE = "one-shot done"
RESTART_ERROR = "restart: the gateway stopped during the run"
HANDOFF_GRACE = timedelta(seconds=60)  # from the claim to the prompt entering the inbox
MAX_CONCURRENT_FIRINGS = 8  # a burst (many jobs at 09:00) queues here, not on the connection pool


def schedule_repo(store: Store) -> ScheduleRepo:
    """The store's schedule repository."""
    return store.schedules


def session_kind(schedule: ScheduleRecord) -> str:
    return "tick" if schedule.kind == "tick" else "cron"


def run_thread(schedule: ScheduleRecord, job_run_id: int) -> ThreadKey:
    return ThreadKey(session_kind(schedule), schedule.name, str(job_run_id))


def job_run_id_of(thread: ThreadKey) -> int | None:
    """The job run a scheduled session's thread belongs to (None for other threads)."""
    if thread.channel not in ("cron", "tick") or not thread.thread.isdigit():
        return None
    return int(thread.thread)


class Scheduler:
    def __init__(
        self,
        store: Store,
        config: SchedulerConfig,
        *,
        submit: Submit,
        deliver: Deliver,
        now: Callable[[], datetime] | None = None,
        room_for_job: Callable[[int], Awaitable[str | None]] | None = None,
    ):
        self.store = store
        self.config = config
        self.repo = schedule_repo(store)
        self._submit = submit
        self._deliver = deliver
        self._now = now or utcnow
        self._room_for_job = room_for_job  # why a job's spend caps leave no room (None: room)
        self._clock = Clock(self._on_due, self.housekeeping, housekeeping_s=config.poll_interval)
        # Planning and firing one schedule never interleave; different schedules run freely.
        self._locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._reload_lock = asyncio.Lock()
        self._firing = asyncio.Semaphore(MAX_CONCURRENT_FIRINGS)
        self._fingerprint: int | None = None
        self._dirty = False

    @property
    def clock(self) -> Clock:
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
        await self.recover_running()
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
        await self.recover_running()  # runs a dead instance left behind, once their grace is over

    async def _on_due(self, schedule_id: int, when: datetime) -> None:
        async with self._locks[schedule_id]:
            try:
                await self.fire(schedule_id, when)
                schedule = await self.repo.get(schedule_id)
                if schedule is None:
                    self._clock.unplan(schedule_id)
                else:
                    await self._plan(schedule)
            except Exception:  # not handled here: marked, then raised to the clock's catch
                self._dirty = True  # re-plan everything at the next housekeeping
                raise

    async def _plan(self, schedule: ScheduleRecord) -> None:
        """Record what was missed, run what is due, and wait for the next firing."""
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
        last = await self.repo.last_firing(schedule.id)
        since = max(last, schedule.updated_at) if last else schedule.updated_at
        plan = catch_up(table, since=since, now=now, misfire=schedule.misfire, grace=self._grace(schedule))
        await self._record_missed(schedule, plan.missed, plan.uncounted, plan.truncated, since)
        if plan.due is not None:
            await self.fire(schedule.id, plan.due)
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
            return await self._fire(schedule_id, scheduled_for, origin)

    async def _fire(self, schedule_id: int, scheduled_for: datetime, origin: RunOrigin) -> JobRunRecord | None:
        now = self._now()
        schedule = await self.repo.get(schedule_id)
        if schedule is None or (origin == "schedule" and not schedule.enabled):
            return None
        if origin == "schedule" and now - scheduled_for > self._allowed_lateness(schedule):
            late = int((now - scheduled_for).total_seconds())
            await self.repo.record_missed(
                schedule.id, [scheduled_for], error=f"missed: due {late}s ago, beyond the misfire allowance", now=now
            )
            await self._close_one_shot(schedule, "one-shot missed")
            return None
        run = await self.repo.claim(schedule.id, scheduled_for, origin=origin, now=now)
        if run is None:
            return None
        if origin == "schedule":
            await self._close_one_shot(schedule, ONE_SHOT_DONE)
        if run.status != "running":
            log.info("job %s: firing at %s skipped (%s)", schedule.name, scheduled_for.isoformat(), run.error)
            return run
        full = await self._room_for_job(schedule.id) if self._room_for_job is not None else None
        if full:
            log.info("job %s: firing at %s skipped at a spend cap: %s", schedule.name, scheduled_for.isoformat(), full)
            closed = await self.repo.finish(run.id, status="skipped", error=f"{BUDGET_PREFIX}{full}", now=self._now())
            target = self._target(schedule)
            if closed is not None and target is not None and schedule.notify_on_failure:
                await self._send(run.id, failure_message(target, run.id, skipped_text(schedule, closed.error or "")))
            return closed
        return await self._start_run(schedule, run)

    async def run_now(self, name: str) -> JobRunRecord | None:
        """A manual firing (its own scheduled_for: now). None when there is no such job."""
        schedule = await self.repo.by_name(name)
        if schedule is None:
            return None
        return await self.fire(schedule.id, self._now(), origin="manual")

    async def _close_one_shot(self, schedule: ScheduleRecord, reason: str) -> None:
        if schedule.kind == "at" and schedule.enabled:
            await self.repo.set_enabled(schedule.id, False, reason=reason, now=self._now())

    async def _start_run(self, schedule: ScheduleRecord, run: JobRunRecord) -> JobRunRecord | None:
        thread = run_thread(schedule, run.id)
        kind = session_kind(schedule)
        try:
            session = await self.store.sessions.open(
                str(thread), source=kind, kind=kind, interactive=False, ephemeral=True, schedule_id=schedule.id,  # type: ignore[arg-type]
                max_rounds=schedule.max_rounds, max_tokens=schedule.max_tokens, fresh=True,
            )
            await self.repo.attach_session(run.id, session.id)
            message = InboundMessage(thread=thread, sender=SCHEDULER, text=job_text(schedule), event_id=f"job:{run.id}")
            await self._submit([message])
        except Exception as exc:  # whatever stopped the start is recorded as the run's failure
            log.exception("job %s: run %s could not start", schedule.name, run.id)
            closed = await self.repo.finish(run.id, status="failed", error=f"could not start: {exc}", now=self._now())
            if closed is not None:
                await self._notify_failure(schedule, closed)
            return closed
        return await self.repo.get_run(run.id)

    # ---- outcomes --------------------------------------------------------------------------
    async def on_turn_ended(self, event: TurnEnded) -> None:
        """Close the job run of a scheduled session's turn and deliver its outcome."""
        job_run_id = job_run_id_of(event.thread)
        if job_run_id is None or event.stage not in STATUS_BY_STAGE:
            return  # not a scheduled session, or a turn that parked (headless turns should not)
        status = STATUS_BY_STAGE[event.stage]
        error = event.error or (event.end_reason if status == "failed" else None)
        if event.end_reason == "budget" and event.error.startswith(BUDGET_PREFIX):
            status = "skipped"  # stopped at a spend cap, before the call that would pass it
        closed = await self.repo.finish(
            job_run_id, status=status, error=error or None, run_id=event.run_id, tokens=event.tokens,  # type: ignore[arg-type]
            cost_nano_usd=event.cost_nano_usd, now=self._now(),
        )
        if closed is None:
            return  # already closed (timeout, restart) or unknown: say nothing twice
        schedule = await self.repo.get(closed.schedule_id)
        if schedule is not None:
            await self._deliver_outcome(schedule, closed, event)

    async def _deliver_outcome(self, schedule: ScheduleRecord, run: JobRunRecord, event: TurnEnded) -> None:
        target = self._target(schedule)
        plan = plan_outcome(schedule, run, event)
        if target is None or plan.kind == "none":
            return
        if plan.kind == "notice":
            # Who may tap "Run again": as for any prompt there, the chat's approvers and admins,
            # or else the person whose conversation the chat is (its session's starter).
            chat_session = await self.store.sessions.current(str(target))
            prompt, _ = await self.store.prompts.create(
                kind="rerun", session_id=run.session_id or event.session_id, thread_key=str(target),
                payload={"text": schedule.prompt, "schedule_id": schedule.id, "job_run_id": run.id},
                requested_by=chat_session.started_by if chat_session else "", expires_at=None,
            )
            delivered = await self._send(run.id, rerun_notice(target, run.id, plan.text, prompt.token))
            if delivered:
                await self.store.prompts.set_message_ids(prompt.id, delivered)
            return
        build = result_message if run.status == "success" else failure_message
        await self._send(run.id, build(target, run.id, plan.text))

    async def _notify_failure(self, schedule: ScheduleRecord, run: JobRunRecord) -> None:
        target = self._target(schedule)
        if target is not None and schedule.notify_on_failure:
            await self._send(run.id, failure_message(target, run.id, failure_text(schedule, run.error or "")))

    def _target(self, schedule: ScheduleRecord) -> ThreadKey | None:
        try:
            return parse_deliver_to(schedule.deliver_to)
        except DefinitionError as exc:
            log.error("job %s: %s", schedule.name, exc)
            return None

    async def _send(self, job_run_id: int, message: Outbound | Prompt) -> tuple[str, ...]:
        try:
            delivered = await self._deliver(message)
        except Exception as exc:  # the outcome is recorded; the failed delivery is noted on it
            log.exception("job run %s: delivery to %s failed", job_run_id, message.thread)
            await self.repo.note(job_run_id, f"delivery failed: {exc}")
            return ()
        await self.repo.add_delivered(job_run_id, delivered.message_ids)
        return delivered.message_ids

    # ---- stopping runs ---------------------------------------------------------------------
    async def kill(self, name: str) -> list[JobRunRecord] | None:
        """Stop the job's running runs; None when there is no such job.

        A run whose prompt is still queued is dropped and closed `canceled` here; a run in
        progress gets "/stop" and becomes `canceled` when its turn reports back."""
        schedule = await self.repo.by_name(name)
        if schedule is None:
            return None
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
            await self._notify_failure(schedule, closed)
            stopped.append(closed)
        return stopped

    async def _thread_of(self, schedule: ScheduleRecord, run: JobRunRecord) -> ThreadKey:
        session = await self.store.sessions.get(run.session_id) if run.session_id else None
        return ThreadKey.parse(session.thread_key) if session else run_thread(schedule, run.id)

    async def _send_stop(self, thread: ThreadKey, event_id: str) -> None:
        await self._submit([InboundMessage(thread=thread, sender=SCHEDULER, text="/stop", event_id=event_id)])

    # ---- restart ---------------------------------------------------------------------------
    async def recover_running(self) -> list[JobRunRecord]:
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
                await self.fire(schedule.id, self._now(), origin="retry")
            else:
                await self._notify_failure(schedule, closed)
        return recovered

    async def _still_alive(self, schedule: ScheduleRecord, run: JobRunRecord) -> bool:
        run = await self.repo.get_run(run.id) or run  # the claimer may have moved it on meanwhile
        item = await self.store.inbox.get_by_event(f"job:{run.id}")
        young = run.started_at is not None and self._now() - run.started_at < HANDOFF_GRACE
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
