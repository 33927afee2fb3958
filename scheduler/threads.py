"""Where a job run's session lives: its thread key, and the sender of what the scheduler says."""

from __future__ import annotations

from gateway.events import Sender, ThreadKey
from gateway.store.schedules import ScheduleRecord

SCHEDULER = Sender("scheduler", "scheduler")


def session_kind(schedule: ScheduleRecord) -> str:
    return "tick" if schedule.kind == "tick" else "cron"


def run_thread(schedule: ScheduleRecord, job_run_id: int) -> ThreadKey:
    return ThreadKey(session_kind(schedule), schedule.name, str(job_run_id))


def job_run_id_of(thread: ThreadKey) -> int | None:
    """The job run a scheduled session's thread belongs to (None for other threads)."""
    if thread.channel not in ("cron", "tick") or not thread.thread.isdigit():
        return None
    return int(thread.thread)
