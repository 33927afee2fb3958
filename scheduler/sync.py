"""`scheduler.jobs` in config.yml -> the schedules table, by name.

New jobs are created, changed ones updated, and jobs that left the file are disabled (their
history stays). A job the file did not change keeps its state, so `gateway jobs disable` and
a finished one-shot survive a restart. A job with a mistake is reported and left as it was.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime

from gateway.config import JobConfig, SchedulerConfig
from gateway.store.schedules import NewSchedule, ScheduleExists, ScheduleRecord, ScheduleRepo
from scheduler.definitions import DefinitionError, check_not_past, to_schedule

log = logging.getLogger(__name__)

REMOVED_FROM_CONFIG = "removed from config"
DISABLED_IN_CONFIG = "disabled in config"


@dataclass
class SyncReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.disabled)


async def sync_config(repo: ScheduleRepo, config: SchedulerConfig, now: datetime) -> SyncReport:
    report = SyncReport()
    seen: set[str] = set()
    for job in config.jobs:
        seen.add(job.name)
        try:
            new = to_schedule(job, config, source="config", now=now)
            outcome = await _sync_one(repo, job, new, now)
        except DefinitionError as exc:
            report.errors.append(f"scheduler.jobs[{job.name}]: {exc}")
            continue
        getattr(report, outcome).append(job.name)
    for schedule in await repo.list(source="config"):
        if schedule.name not in seen and schedule.enabled:
            await repo.set_enabled(schedule.id, False, reason=REMOVED_FROM_CONFIG, now=now)
            report.disabled.append(schedule.name)
    for problem in report.errors:
        log.error("%s (the job was left as it was)", problem)
    return report


async def _sync_one(repo: ScheduleRepo, job: JobConfig, new: NewSchedule, now: datetime) -> str:
    existing = await repo.by_name(new.name)
    if existing is None:
        check_not_past(new, now)
        try:
            await repo.create(new, now=now)
            return "created"
        except ScheduleExists:  # every instance syncs as it starts: another one created it first
            existing = await repo.by_name(new.name)
            if existing is None:
                raise
    return await _sync_existing(repo, job, new, existing, now)


async def _sync_existing(
    repo: ScheduleRepo, job: JobConfig, new: NewSchedule, existing: ScheduleRecord, now: datetime
) -> str:
    if new.kind == "at" and job.in_ and existing.kind == "at" and existing.source == "config":
        new = replace(new, spec=existing.spec)  # `in:` was resolved once, when the job was created
    if new.definition() != existing.definition() or existing.source != "config":
        if new.spec != existing.spec:
            check_not_past(new, now)
        values = asdict(new)
        values["disabled_reason"] = None if new.enabled else DISABLED_IN_CONFIG
        await repo.update(existing.id, now=now, **values)
        return "updated"
    if not new.enabled and existing.enabled:
        await repo.set_enabled(existing.id, False, reason=DISABLED_IN_CONFIG, now=now)
        return "disabled"
    if new.enabled and not existing.enabled and existing.disabled_reason in (REMOVED_FROM_CONFIG, DISABLED_IN_CONFIG):
        await repo.set_enabled(existing.id, True, now=now)
        return "updated"
    return "unchanged"
