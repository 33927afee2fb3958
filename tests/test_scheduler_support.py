"""Stand-ins for the core around the scheduler: a settable clock, submit and deliver recorders.

`Core.submit` writes the events into the store's inbox like the real intake does, so the
scheduler's recovery sees the same rows it would in production.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from gateway.config import JobConfig, SchedulerConfig
from gateway.events import Delivered, InboundEvent, InboundMessage, Outbound, Prompt, SubmitResult, TurnEnded
from gateway.store import NewItem, Store
from gateway.store.schedules import ScheduleRecord
from scheduler.definitions import job_config, to_schedule
from scheduler.jobs import Scheduler, schedule_repo


def real_now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


class Now:
    """A clock the test moves by hand."""

    def __init__(self, start: datetime):
        self.value = start

    def __call__(self) -> datetime:
        return self.value

    def set(self, value: datetime) -> None:
        self.value = value

    def advance(self, **delta: float) -> datetime:
        self.value += timedelta(**delta)
        return self.value


class Core:
    """What the scheduler calls: `submit` (into the store's inbox) and `deliver` (recorded)."""

    def __init__(self, store: Store, *, fail_delivery: bool = False):
        self.store = store
        self.submitted: list[InboundMessage] = []
        self.delivered: list[Outbound | Prompt] = []
        self.fail_delivery = fail_delivery

    async def submit(
        self, events: Sequence[InboundEvent], *, cursor: tuple[str, str] | None = None
    ) -> list[SubmitResult]:
        items = [NewItem(e.event_id, str(e.thread), "message", {"text": getattr(e, "text", "")}) for e in events]
        created = await self.store.inbox.add(items, cursor=cursor)
        self.submitted.extend(
            e for e, new in zip(events, created, strict=False) if new and isinstance(e, InboundMessage)
        )
        return [SubmitResult(e.event_id, duplicate=not new) for e, new in zip(events, created, strict=False)]

    async def deliver(self, message: Outbound | Prompt) -> Delivered:
        if self.fail_delivery:
            raise ConnectionError("chat unreachable")
        self.delivered.append(message)
        return Delivered((f"msg-{len(self.delivered)}",))

    def prompts_for(self, job_name: str) -> list[InboundMessage]:
        return [m for m in self.submitted if m.thread.chat == job_name and m.text != "/stop"]

    def stops(self) -> list[InboundMessage]:
        return [m for m in self.submitted if m.text == "/stop"]

    async def pick_up(self, message: InboundMessage) -> None:
        """A worker took the message into a turn (its inbox row is done)."""
        item = await self.store.inbox.get_by_event(message.event_id)
        await self.store.inbox.finish([item.id])


def make_scheduler(store: Store, now: Now, core: Core, **config: Any) -> Scheduler:
    return Scheduler(store, SchedulerConfig(**config), submit=core.submit, deliver=core.deliver, now=now)


async def add_job(
    scheduler: Scheduler, *, now: datetime | None = None, source: str = "cli", **fields: Any
) -> ScheduleRecord:
    fields.setdefault("prompt", "Summarise the news")
    new = to_schedule(job_config(fields), scheduler.config, source=source, now=now or scheduler._now())
    return await schedule_repo(scheduler.store).create(new, now=now or scheduler._now())


def ended(message: InboundMessage, stage: str = "SUCCESS", reply: str = "All good.", **extra: Any) -> TurnEnded:
    """The core's report for the turn that `message` started."""
    values: dict[str, Any] = dict(
        thread=message.thread, session_id=1, run_id=77, stage=stage,
        end_reason={"SUCCESS": "reply", "FAILED": "error", "CANCELED": "canceled"}[stage], reply=reply,
    )
    values.update(extra)
    return TurnEnded(**values)


def job(**fields: Any) -> JobConfig:
    return JobConfig(**fields)
