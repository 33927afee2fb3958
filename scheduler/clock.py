"""The clock: APScheduler 3.11 `AsyncIOScheduler` with the memory job store, on the leader only.

APScheduler only waits. Each enabled schedule has at most one APScheduler job: a one-shot at its
next firing, carrying that firing's time, so the time that is claimed in `job_runs` is exactly
the scheduled one (never "now"). When it fires, the scheduler claims and runs the firing and
plans the next one. A periodic housekeeping job picks up schedule changes made elsewhere (CLI,
another instance) and stops runs past their timeout. Nothing here is durable: the schedules
table is the truth, and the clock is rebuilt from it at start and on every change.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger

from scheduler.triggers import UTC

log = logging.getLogger(__name__)

OnDue = Callable[[int, datetime], Awaitable[None]]
OnHousekeeping = Callable[[], Awaitable[None]]
HOUSEKEEPING_ID = "housekeeping"


class Clock:
    def __init__(self, on_due: OnDue, on_housekeeping: OnHousekeeping, *, housekeeping_s: float):
        self._on_due = on_due
        self._on_housekeeping = on_housekeeping
        self._housekeeping_s = housekeeping_s
        self._aps: AsyncIOScheduler | None = None

    @property
    def running(self) -> bool:
        return self._aps is not None

    def start(self) -> None:
        """Start waiting (inside the running event loop)."""
        if self._aps is not None:
            return
        aps = AsyncIOScheduler(
            timezone=UTC,
            jobstores={"default": {"type": "memory"}},
            # Lateness is judged by the scheduler against each job's misfire policy, so
            # APScheduler must never drop a firing on its own.
            job_defaults={"misfire_grace_time": None, "coalesce": True, "max_instances": 1},
        )
        aps.add_job(
            self._housekeeping, IntervalTrigger(seconds=self._housekeeping_s, timezone=UTC), id=HOUSEKEEPING_ID
        )
        aps.start()
        self._aps = aps

    def stop(self) -> None:
        if self._aps is not None:
            self._aps.shutdown(wait=False)
            self._aps = None

    def plan(self, schedule_id: int, when: datetime) -> None:
        """Fire `schedule_id` at `when` (replacing what was planned for it)."""
        if self._aps is None:
            return
        self._aps.add_job(
            self._due,
            DateTrigger(run_date=when, timezone=UTC),
            args=(schedule_id, when),
            id=str(schedule_id),
            replace_existing=True,
        )

    def unplan(self, schedule_id: int) -> None:
        if self._aps is not None and self._aps.get_job(str(schedule_id)) is not None:
            self._aps.remove_job(str(schedule_id))

    def clear(self) -> None:
        for schedule_id in list(self.planned()):
            self.unplan(schedule_id)

    def planned(self) -> dict[int, datetime]:
        """Schedule id -> the firing the clock waits for."""
        if self._aps is None:
            return {}
        return {int(job.id): job.args[1] for job in self._aps.get_jobs() if job.id != HOUSEKEEPING_ID}

    async def _due(self, schedule_id: int, when: datetime) -> None:
        try:
            await self._on_due(schedule_id, when)
        except Exception:  # the clock must keep ticking for the other jobs
            log.exception("firing schedule %s at %s failed", schedule_id, when.isoformat())
        except asyncio.CancelledError:
            # The gateway stopping mid-firing (its loop cancels what runs): one line, not
            # APScheduler's traceback of a "failed" job. A run it claimed is closed as abandoned
            # by the next start (Scheduler.close_abandoned_runs); its prompt, once submitted, stays.
            log.info("firing schedule %s at %s interrupted by the gateway stopping", schedule_id, when.isoformat())

    async def _housekeeping(self) -> None:
        try:
            await self._on_housekeeping()
        except Exception:  # the outer catch of the housekeeping job: the next round tries again
            log.exception("scheduler housekeeping failed")


class ManualClock:
    """A clock that waits for nobody: whoever holds it (a test, a benchmark with its own time)
    runs the next planned firing with `run_next`. Same planning interface as `Clock`."""

    def __init__(self, on_due: OnDue, on_housekeeping: OnHousekeeping):
        self._on_due = on_due
        self._on_housekeeping = on_housekeeping
        self._planned: dict[int, datetime] = {}
        self._running = False

    @property
    def running(self) -> bool:
        return self._running

    def start(self) -> None:
        self._running = True

    def stop(self) -> None:
        self._running = False
        self._planned.clear()

    def plan(self, schedule_id: int, when: datetime) -> None:
        if self._running:
            self._planned[schedule_id] = when

    def unplan(self, schedule_id: int) -> None:
        self._planned.pop(schedule_id, None)

    def clear(self) -> None:
        self._planned.clear()

    def planned(self) -> dict[int, datetime]:
        return dict(self._planned)

    def next_due(self) -> tuple[int, datetime] | None:
        """The earliest planned firing (schedule id, time), or None."""
        if not self._planned:
            return None
        schedule_id = min(self._planned, key=lambda i: (self._planned[i], i))
        return schedule_id, self._planned[schedule_id]

    async def run_next(self) -> tuple[int, datetime] | None:
        """Run the earliest planned firing now (the caller has moved its time there)."""
        due = self.next_due()
        if due is not None:
            del self._planned[due[0]]
            await self._on_due(*due)
        return due

    async def housekeeping(self) -> None:
        await self._on_housekeeping()
