"""The settings of the scheduler and its jobs."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from gateway.config.base import Section, parse_duration


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

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SchedulerConfig(Section):
    enabled: bool = True
    timezone: str = "UTC"
    misfire_grace: float = 3600.0
    quiet_sentinel: str = "NOTHING_TO_REPORT"
    timeout: float = 3600.0  # a run still going after this (unless the job sets `timeout`) is stopped
    poll_interval: float = 15.0  # the leader looks for schedule changes and overdue runs this often
    jobs: list[JobConfig] = []

    _duration = field_validator("misfire_grace", "timeout", "poll_interval", mode="before")(
        lambda cls, v: parse_duration(v)
    )
