"""A job run's end: the run closed with its status, and its outcome delivered where the job says.

The outcome goes out through `deliver` (the outbox); a delivery that fails is noted on the run,
which keeps its status. A run stopped by approvals it could not get offers "Run again".
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from gateway.events import Delivered, Outbound, Prompt, ThreadKey, TurnEnded
from gateway.store import Store
from gateway.store.schedules import JobRunRecord, ScheduleRecord, ScheduleRepo
from scheduler.checks import failure_notice
from scheduler.definitions import DefinitionError, parse_deliver_to
from scheduler.delivery import (
    BUDGET_PREFIX,
    failure_message,
    failure_text,
    plan_outcome,
    rerun_notice,
    result_message,
    skipped_text,
)
from scheduler.threads import job_run_id_of

log = logging.getLogger(__name__)

Deliver = Callable[[Outbound | Prompt], Awaitable[Delivered]]
OpenTopic = Callable[[ThreadKey, str], Awaitable[ThreadKey | None]]
STATUS_BY_STAGE = {"SUCCESS": "success", "FAILED": "failed", "CANCELED": "canceled"}


class Outcomes:
    def __init__(
        self, store: Store, repo: ScheduleRepo, deliver: Deliver, now: Callable[[], datetime],
        open_topic: OpenTopic | None = None,
    ) -> None:
        self.store = store
        self.repo = repo
        self._deliver = deliver
        self._now = now
        self._open_topic = open_topic  # a job's topic of its own (`topic`): the channel opens it

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
        target = await self.target(schedule)
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

    async def notify_failure(self, schedule: ScheduleRecord, run: JobRunRecord) -> None:
        target = await self.target(schedule)
        if target is not None and schedule.notify_on_failure:
            await self._send(run.id, failure_message(target, run.id, failure_text(schedule, run.error or "")))

    async def notify_skipped(self, schedule: ScheduleRecord, run_id: int, closed: JobRunRecord | None) -> None:
        """A firing skipped at a spend cap is told like a failure (once: when this closed it)."""
        target = await self.target(schedule)
        if closed is not None and target is not None and schedule.notify_on_failure:
            await self._send(run_id, failure_message(target, run_id, skipped_text(schedule, closed.error or "")))

    async def notify_check_failure(
        self, schedule: ScheduleRecord, run: JobRunRecord, failures: int, error: str
    ) -> None:
        """A job's check failing `failures` times in a row, told once (until it works again)."""
        target = await self.target(schedule)
        if target is not None and schedule.notify_on_failure:
            await self._send(run.id, failure_message(target, run.id, failure_notice(schedule, failures, error)))

    async def target(self, schedule: ScheduleRecord) -> ThreadKey | None:
        """Where the job's outcome (and what its runs send) goes: `deliver_to`, or its own topic there."""
        try:
            target = parse_deliver_to(schedule.deliver_to)
        except DefinitionError as exc:
            log.error("job %s: %s", schedule.name, exc)
            return None
        if target is None or not schedule.topic or target.thread:
            return target
        return await self._own_topic(schedule, target)

    async def _own_topic(self, schedule: ScheduleRecord, chat: ThreadKey) -> ThreadKey:
        """The job's topic in `chat` (`topic`): the one it opened before, else a new one (kept in
        its state); the chat itself when no topic can be opened there (said in the log)."""
        kept = (await self.repo.state(schedule.id)).topic_thread
        if kept:
            thread = ThreadKey.parse(kept)
            if (thread.channel, thread.chat) == (chat.channel, chat.chat):  # deliver_to may have changed
                return thread
        opened = await self._open_topic(chat, schedule.topic or schedule.name) if self._open_topic else None
        if opened is None:
            log.warning("job %s: no topic %r could be opened in %s; delivering to the chat itself",
                        schedule.name, schedule.topic, chat)
            return chat
        await self.repo.save_state(schedule.id, topic_thread=str(opened), now=self._now())
        return opened

    async def _send(self, job_run_id: int, message: Outbound | Prompt) -> tuple[str, ...]:
        try:
            delivered = await self._deliver(message)
        except Exception as exc:  # the outcome is recorded; the failed delivery is noted on it
            log.exception("job run %s: delivery to %s failed", job_run_id, message.thread)
            await self.repo.note(job_run_id, f"delivery failed: {exc}")
            return ()
        await self.repo.add_delivered(job_run_id, delivered.message_ids)
        return delivered.message_ids
