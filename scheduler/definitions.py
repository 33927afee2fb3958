"""Job definitions from config, the CLI or the agent, checked and turned into stored schedules.

All three sources go through `to_schedule`, so a job is understood the same way wherever it
was written, and every problem comes back as one clear `DefinitionError`.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from gateway.config import DEFAULT_MODEL, CheckConfig, JobConfig, SchedulerConfig, parse_duration
from gateway.events import ThreadKey
from gateway.store.schedules import NewSchedule
from scheduler.checklist import ChecklistNameError, check_name
from scheduler.triggers import LATE_OK, UTC, TriggerError, parse_active_hours, parse_at, parse_interval, timetable, zone

NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # part of a thread key: no colons
MIN_INTERVAL = timedelta(seconds=60)
DELIVER_CHANNELS = ("telegram", "slack")
CHECK_TIMEOUT_MAX_S = 600
CHECK_MAX_OUTPUT_LIMIT = 262_144


class DefinitionError(ValueError):
    """A job definition that cannot be used; the message names the field and the fix."""


def parse_deliver_to(text: str) -> ThreadKey | None:
    """`telegram:<chat>[:<topic>]`, `slack:<channel>[:<thread_ts>]` or `none` (-> None)."""
    value = (text or "").strip()
    if value.lower() in ("", "none"):
        return None
    try:
        key: ThreadKey | None = ThreadKey.parse(value)
    except ValueError:
        key = None
    if key is None or key.channel not in DELIVER_CHANNELS or ":" in key.thread:
        raise DefinitionError(
            f"deliver_to {text!r}: use telegram:<chat>[:<topic>], slack:<channel>[:<thread_ts>] or none"
        )
    return key


def deliver_to_text(thread: ThreadKey) -> str:
    """The `deliver_to` value that sends to `thread` (the inverse of `parse_deliver_to`)."""
    if thread.channel not in DELIVER_CHANNELS:
        raise DefinitionError(f"jobs can deliver to Telegram or Slack only, not to {thread.channel}")
    return f"{thread.channel}:{thread.chat}" + (f":{thread.thread}" if thread.thread else "")


def job_config(fields: dict[str, Any]) -> JobConfig:
    """A JobConfig from loose fields (CLI flags, tool arguments); None values are left out."""
    try:
        return JobConfig.model_validate({k: v for k, v in fields.items() if v is not None})
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        errors = exc.errors() if hasattr(exc, "errors") else [{"loc": (), "msg": str(exc)}]
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}".lstrip(": ") for e in errors)
        raise DefinitionError(problems) from None


def _kind(job: JobConfig) -> str:
    """The declared kind, or the one implied by the only timing field given."""
    if "kind" in job.model_fields_set:
        return job.kind
    given = [name for name in ("cron", "every", "at", "in_") if getattr(job, name)]
    if len(given) == 1:
        return {"cron": "cron", "every": "every", "at": "at", "in_": "at"}[given[0]]
    return job.kind


def _seconds(value: Any, field: str) -> int | None:
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise DefinitionError(f"{field}: {exc}") from None
    if seconds < 0:
        raise DefinitionError(f"{field}: must not be negative")
    return int(seconds)


def _spec(job: JobConfig, kind: str, tz: str, now: datetime) -> str:
    if kind == "cron":
        if not job.cron:
            raise DefinitionError("kind cron needs `cron`, e.g. cron: '0 9 * * 1-5'")
        return " ".join(job.cron.split())
    if kind in ("every", "tick"):
        if not job.every:
            raise DefinitionError(f"kind {kind} needs `every`, e.g. every: 30m")
        if parse_interval(job.every) < MIN_INTERVAL:
            raise DefinitionError(f"every: {job.every!r} is too short; the minimum is 60s")
        return job.every.strip()
    if kind == "at":
        if bool(job.at) == bool(job.in_):
            raise DefinitionError("kind at needs exactly one of `at` (an ISO time) or `in` (e.g. in: 20m)")
        when = parse_at(job.at, tz) if job.at else now + parse_interval(job.in_ or "")
        return when.astimezone(UTC).isoformat(timespec="seconds")
    raise DefinitionError(f"unknown kind {kind!r}; use cron, every, at or tick")


def _check_fields_fit_kind(job: JobConfig, kind: str) -> None:
    misplaced = {
        "cron": kind != "cron" and job.cron,
        "every": kind not in ("every", "tick") and job.every,
        "at": kind != "at" and (job.at or job.in_),
        "active_hours": kind != "tick" and job.active_hours,
        "checklist": kind != "tick" and job.checklist,
        "idle_backoff": kind not in ("every", "tick") and job.idle_backoff,
    }
    wrong = [name for name, bad in misplaced.items() if bad]
    if wrong:
        raise DefinitionError(f"{', '.join(wrong)} does not apply to kind {kind}")


def to_schedule(
    job: JobConfig, defaults: SchedulerConfig, *, source: str, now: datetime, created_by: str | None = None
) -> NewSchedule:
    """Check a job definition and resolve it (`in: 20m` becomes an absolute time now)."""
    try:
        return _to_schedule(job, defaults, source, now, created_by)
    except TriggerError as exc:
        raise DefinitionError(str(exc)) from None


def _to_schedule(
    job: JobConfig, defaults: SchedulerConfig, source: str, now: datetime, created_by: str | None
) -> NewSchedule:
    if not NAME.match(job.name):
        raise DefinitionError(f"name {job.name!r}: use 1-64 letters, digits, _ . or -")
    kind = _kind(job)
    _check_fields_fit_kind(job, kind)
    tz = job.timezone or defaults.timezone
    zone(tz)
    spec = _spec(job, kind, tz, now)
    timetable(kind, spec, tz, anchor=now, active_hours=job.active_hours)  # parses the cron text
    if job.active_hours:
        parse_active_hours(job.active_hours)
    if not job.prompt.strip():
        raise DefinitionError("prompt is empty: say what the job should do")
    parse_deliver_to(job.deliver_to)
    for field in ("max_rounds", "max_tokens"):
        value = getattr(job, field)
        if value is not None and value < 1:
            raise DefinitionError(f"{field}: must be at least 1")
    timeout = _seconds(job.timeout, "timeout")
    if timeout is not None and timeout < 1:
        raise DefinitionError("timeout: must be at least 1s")
    check = check_spec(job.check) if job.check is not None else None
    idle_max_every = _idle_max_every(job, spec) if job.idle_backoff is not None else None
    failures = job.check_failures_before_report
    if failures is not None and failures < 1:
        raise DefinitionError("check_failures_before_report: must be at least 1 (1: tell the first failure)")
    if failures is not None and check is None:
        raise DefinitionError("check_failures_before_report: the job has no check; add one or leave it out")
    checklist = _checklist(job.checklist) if job.checklist is not None else None
    topic = _topic(job) if job.topic is not None else None
    return NewSchedule(
        name=job.name,
        kind=kind,  # type: ignore[arg-type]
        spec=spec,
        timezone=tz,
        prompt=job.prompt.strip(),
        deliver_to=(job.deliver_to or "none").strip(),
        max_rounds=job.max_rounds,
        max_tokens=job.max_tokens,
        model=job.model if job.model and job.model != DEFAULT_MODEL else None,
        timeout_s=timeout,
        misfire=job.misfire,
        misfire_grace_s=_seconds(job.misfire_grace, "misfire_grace"),
        notify_on_failure=job.notify_on_failure,
        enabled=job.enabled,
        active_hours=job.active_hours.strip() if job.active_hours else None,
        quiet_sentinel=(job.quiet_sentinel or defaults.quiet_sentinel) if kind == "tick" else None,
        source=source,
        created_by=created_by,
        check_spec=check,
        checklist=checklist,
        idle_max_every=idle_max_every,
        check_failures_before_report=failures,
        topic=topic,
    )


def _topic(job: JobConfig) -> str:
    name = (job.topic or "").strip()
    if not 1 <= len(name) <= 128:
        raise DefinitionError("topic: a name of 1-128 characters for the job's own topic")
    target = parse_deliver_to(job.deliver_to)
    if target is None or target.channel != "telegram" or target.thread:
        raise DefinitionError(
            "topic: the job opens its topic in a Telegram chat: set deliver_to to telegram:<chat> (no topic id)"
        )
    return name


def check_spec(check: CheckConfig) -> dict[str, Any]:
    """The stored form of a job's `check` (see scheduler/checks.py), or a DefinitionError."""
    given = [name for name in ("command", "url", "mcp") if getattr(check, name) is not None]
    if len(given) != 1:
        raise DefinitionError(
            "check: give exactly one of command, url or mcp, e.g. check: {command: 'python3 unread.py'}"
        )
    kind = given[0]
    spec = _check_source(check, kind)
    if check.wake_when == "exit_zero" and kind != "command":
        raise DefinitionError(f"check.wake_when: exit_zero is for a command check; use changed or nonempty for {kind}")
    if check.network and kind != "command":
        raise DefinitionError(f"check.network is for a command check; leave it out of a {kind} check")
    timeout = _seconds(check.timeout, "check.timeout") or 0
    if not 1 <= timeout <= CHECK_TIMEOUT_MAX_S:
        raise DefinitionError(f"check.timeout: must be between 1s and {CHECK_TIMEOUT_MAX_S // 60}m, e.g. 30s")
    if not 1 <= check.max_output <= CHECK_MAX_OUTPUT_LIMIT:
        raise DefinitionError(f"check.max_output: must be between 1 and {CHECK_MAX_OUTPUT_LIMIT} bytes")
    spec.update(wake_when=check.wake_when, timeout_s=timeout, max_output=check.max_output)
    if kind == "command":
        spec["network"] = check.network
    return spec


def _check_source(check: CheckConfig, kind: str) -> dict[str, Any]:
    if kind == "command":
        if not (check.command or "").strip():
            raise DefinitionError("check.command is empty: give the command line to run")
        return {"command": check.command}
    if kind == "url":
        return {"url": _check_url(check.url or "")}
    assert check.mcp is not None
    if not check.mcp.server.strip() or not check.mcp.tool.strip():
        raise DefinitionError("check.mcp needs server and tool, e.g. mcp: {server: mail, tool: unread}")
    return {"mcp": {"server": check.mcp.server, "tool": check.mcp.tool, "arguments": dict(check.mcp.arguments)}}


def _check_url(url: str) -> str:
    value = url.strip()
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DefinitionError(f"check.url {url!r}: use an http:// or https:// URL with a host")
    return value


def _idle_max_every(job: JobConfig, every: str) -> str:
    assert job.idle_backoff is not None
    if job.check is None and not job.checklist:
        raise DefinitionError("idle_backoff needs a check or a checklist: only they can tell a tick is idle")
    text = job.idle_backoff.max_every.strip()
    try:
        longest = parse_interval(text)
    except TriggerError:
        raise DefinitionError(f"idle_backoff.max_every {text!r}: use an interval like 4h") from None
    if longest < parse_interval(every):
        raise DefinitionError(f"idle_backoff.max_every {text!r} is shorter than every {every!r}; make it longer")
    return text


def _checklist(name: str) -> str:
    """A file name in the workspace's checklists/ directory (scheduler/checklist.py)."""
    try:
        return check_name(name)
    except ChecklistNameError as exc:
        raise DefinitionError(str(exc)) from None


def check_not_past(new: NewSchedule, now: datetime) -> None:
    """A one-shot job for a time already gone would never run: refuse it."""
    if new.kind == "at" and datetime.fromisoformat(new.spec) < now - LATE_OK:
        raise DefinitionError(f"at {new.spec} is in the past")
