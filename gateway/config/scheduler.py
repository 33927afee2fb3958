"""The settings of the scheduler and its jobs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from gateway.config.base import Section, parse_duration

CHECK_TIMEOUT_S = 30.0
CHECK_MAX_OUTPUT = 16384  # bytes of a check's output given to the model (and hashed)


class McpCheckConfig(Section):
    """A call of a read-only tool of a trusted MCP server."""

    server: str
    tool: str
    arguments: dict[str, Any] = {}


class CheckConfig(Section):
    """What runs before the model at each firing (exactly one of command, url, mcp); the model
    wakes only when it finds something (see docs/scheduler.md, "Checks")."""

    command: str | None = None  # a shell command, run in the shell's sandbox with the job's rights
    url: str | None = None  # an HTTP GET, under web_fetch's address rules, with ETag / Last-Modified
    mcp: McpCheckConfig | None = None
    wake_when: Literal["changed", "nonempty", "exit_zero"] = "changed"
    timeout: str | float = CHECK_TIMEOUT_S
    max_output: int = CHECK_MAX_OUTPUT  # bytes kept of the output (hashed and shown to the model)
    network: bool = False  # a command's network (off: the sandbox has none)


class IdleBackoffConfig(Section):
    """While a tick's check finds nothing its interval doubles, up to `max_every`."""

    max_every: str


class JobConfig(Section):
    name: str
    kind: Literal["cron", "every", "at", "tick"] = "cron"
    cron: str | None = None
    every: str | None = None
    at: str | None = None
    in_: str | None = Field(None, alias="in")
    timezone: str | None = None
    prompt: str = ""
    deliver_to: str = "none"
    max_rounds: int | None = None
    max_tokens: int | None = None
    model: str | None = None  # a name of llm.models (or "default"); else the default model
    timeout: str | float | None = None
    misfire: Literal["run_once", "skip"] = "run_once"
    misfire_grace: str | float | None = None
    notify_on_failure: bool = True
    enabled: bool = True
    active_hours: str | None = None  # "08:00-22:00" for ticks
    quiet_sentinel: str | None = None
    check: CheckConfig | None = None
    checklist: str | None = None  # a workspace file a tick works through (kind tick)
    idle_backoff: IdleBackoffConfig | None = None  # kind tick with a check or a checklist
    check_failures_before_report: int | None = None  # None: scheduler.check_failures_before_report
    # Deliver into a topic of its own, by this name, in deliver_to's Telegram chat (a private chat of a
    # bot with topics, or a forum the bot may add topics to): opened at the first delivery, then kept.
    topic: str | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SchedulerConfig(Section):
    enabled: bool = True
    timezone: str = "UTC"
    misfire_grace: float = 3600.0
    quiet_sentinel: str = "NOTHING_TO_REPORT"
    timeout: float = 3600.0  # a run still going after this (unless the job sets `timeout`) is stopped
    poll_interval: float = 15.0  # the leader looks for schedule changes and overdue runs this often
    check_failures_before_report: int = 3  # a job's check failing this many times in a row is told once
    jobs: list[JobConfig] = []

    _duration = field_validator("misfire_grace", "timeout", "poll_interval", mode="before")(
        lambda cls, v: parse_duration(v)
    )
