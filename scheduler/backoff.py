"""Idle backoff: a job whose checks keep finding nothing fires less and less often.

`idle_backoff: {max_every: 4h}` on an `every` or `tick` job: each firing skipped for "no change"
doubles the interval to the next one (1m, 2m, 4m, … up to `max_every`); the first firing that
wakes the model brings it back to `every`, on the job's own grid. The stretched interval lives
in the job's state (`schedule_states.backoff_s`) and the plan counts from the last firing, so a
stretched interval is a slower timetable, never a run of "missed" firings. A firing that failed,
was skipped for another reason (still running, a spend cap) or was run by hand changes nothing.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from gateway.store.schedules import JobRunRecord, ScheduleRecord, ScheduleRepo
from scheduler.checks import NO_CHANGE
from scheduler.triggers import ActiveHoursTimetable, IntervalTimetable, Timetable, parse_active_hours, parse_interval

log = logging.getLogger(__name__)



def backs_off(schedule: ScheduleRecord) -> bool:
    return bool(schedule.idle_max_every) and schedule.kind in ("every", "tick")


def stretched(every: timedelta, current: timedelta | None, max_every: timedelta) -> timedelta | None:
    """The interval after one more idle firing: twice the current one, at most `max_every`
    (None: no stretch, when `max_every` is not above `every`)."""
    if max_every <= every:
        return None
    return min((current or every) * 2, max_every)


def woke(run: JobRunRecord) -> bool:
    """The firing opened a session (its check or checklist woke the model)."""
    return run.session_id is not None or run.status == "running"


def idle(run: JobRunRecord) -> bool:
    return run.status == "skipped" and run.error == NO_CHANGE


class IdleBackoff:
    def __init__(self, repo: ScheduleRepo):
        self.repo = repo

    async def current(self, schedule: ScheduleRecord, last: datetime | None) -> timedelta | None:
        """The stretched interval in force, or None (the job's own timetable). A job defined
        again after its last firing starts from `every`."""
        if not backs_off(schedule) or last is None or last < schedule.updated_at:
            return None
        backoff_s = (await self.repo.state(schedule.id)).backoff_s
        every = parse_interval(schedule.spec)
        if not backoff_s or timedelta(seconds=backoff_s) <= every:
            return None
        return min(timedelta(seconds=backoff_s), parse_interval(schedule.idle_max_every or schedule.spec))

    def timetable(self, schedule: ScheduleRecord, interval: timedelta, last: datetime) -> Timetable:
        """Every `interval` from the last firing (inside the tick's active hours, if it has some)."""
        table: Timetable = IntervalTimetable(interval, last)
        if schedule.kind == "tick" and schedule.active_hours:
            table = ActiveHoursTimetable(table, parse_active_hours(schedule.active_hours), schedule.timezone)
        return table

    async def after_firing(self, schedule: ScheduleRecord, run: JobRunRecord | None) -> None:
        """Stretch the interval after an idle firing; back to `every` after one that woke."""
        if run is None or run.origin != "schedule" or not backs_off(schedule):
            return
        if idle(run):
            # the interval that led to this firing: none when the job was defined again since the one before
            current = await self.current(schedule, await self._firing_before(schedule.id, run.scheduled_for))
            every = parse_interval(schedule.spec)
            longer = stretched(every, current, parse_interval(schedule.idle_max_every or schedule.spec))
            if longer is not None and longer != current:
                await self.repo.save_state(schedule.id, backoff_s=int(longer.total_seconds()))
                log.debug("job %s: idle, next firing in %s", schedule.name, longer)
        elif woke(run) and (await self.repo.state(schedule.id)).backoff_s:
            await self.repo.save_state(schedule.id, backoff_s=None)

    async def _firing_before(self, schedule_id: int, moment: datetime) -> datetime | None:
        earlier = [
            r.scheduled_for
            for r in await self.repo.recent_runs(schedule_id, limit=10)
            if r.origin == "schedule" and r.scheduled_for < moment
        ]
        return max(earlier, default=None)
