"""Job controls shared by `gateway jobs` and the web console: next firing, run now, kill,
enable/disable, each answered in words."""

from __future__ import annotations

from datetime import datetime

from gateway.config import SchedulerConfig
from gateway.store.schedules import ScheduleRecord
from scheduler.definitions import DefinitionError, to_schedule
from scheduler.jobs import Scheduler
from scheduler.triggers import TriggerError, timetable


def next_firing(schedule: ScheduleRecord, now: datetime) -> datetime | None:
    """None when the job is off or will not fire again; TriggerError when its spec is invalid."""
    if not schedule.enabled:
        return None
    table = timetable(
        schedule.kind, schedule.spec, schedule.timezone, anchor=schedule.updated_at, active_hours=schedule.active_hours
    )
    return table.next_after(now)


def config_jobs(config: SchedulerConfig, now: datetime) -> list[tuple[str, datetime | None, str]]:
    """Each job of `scheduler.jobs` read as the scheduler will read it (`gateway doctor`,
    `gateway status`): (name, its next firing (None when off or over), what is wrong with it)."""
    timings: list[tuple[str, datetime | None, str]] = []
    for job in config.jobs:
        try:
            new = to_schedule(job, config, source="config", now=now)
            table = timetable(new.kind, new.spec, new.timezone, anchor=now, active_hours=new.active_hours)
        except (DefinitionError, TriggerError) as exc:
            timings.append((job.name, None, str(exc)))
            continue
        timings.append((job.name, table.next_after(now) if new.enabled else None, ""))
    return timings


async def run_now(scheduler: Scheduler, schedule: ScheduleRecord, now: datetime) -> tuple[bool, str]:
    run = await scheduler.fire(schedule.id, now, origin="manual")
    if run is None:
        return False, f"{schedule.name} was already fired at {now.isoformat()}"
    if run.status == "skipped":
        return False, f"{schedule.name} is {run.error}; not started"
    if run.status != "running":
        return False, f"{schedule.name}: {run.error}"
    return True, f"{schedule.name}: job run #{run.id} queued; the serving gateway runs it and delivers to " + (
        schedule.deliver_to
    )


async def kill(scheduler: Scheduler, schedule: ScheduleRecord) -> str:
    runs = await scheduler.kill(schedule.name) or []
    if not runs:
        return f"{schedule.name} is not running"
    return f"{schedule.name}: stop requested for job run(s) {', '.join(f'#{r.id}' for r in runs)}"


async def switch(scheduler: Scheduler, schedule: ScheduleRecord, enabled: bool, now: datetime) -> str:
    changed = await scheduler.repo.set_enabled(schedule.id, enabled, reason="disabled by operator", now=now)
    word = "enabled" if enabled else "disabled"
    return f"{schedule.name} {word}" if changed else f"{schedule.name} was already {word}"


__all__ = ["TriggerError", "config_jobs", "kill", "next_firing", "run_now", "switch"]
