"""What the console needs of the running gateway, as a protocol: the composition root
(gateway/app.py) provides it, so the console imports neither the scheduler nor the channels."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from gateway.config import Config
from gateway.events import InboundEvent, SubmitResult
from gateway.store import Store
from gateway.store.schedules import ScheduleRecord


class Operations(Protocol):
    store: Store
    config: Config

    @property
    def instance_id(self) -> str: ...

    async def submit(self, events: Sequence[InboundEvent]) -> list[SubmitResult]:
        """The inbox's intake: a console decision is a button press like a chat's."""

    def channel_states(self) -> dict[str, str]:
        """Each channel and its state ("running", "not started")."""

    def mcp_summary(self) -> dict[str, dict[str, Any]]: ...

    async def model_server(self) -> dict[str, Any]:
        """The default model's server as /readyz tells it (gateway/llm/checkup.py, health.py):
        `model_server_state` with `ready` and the `problem` found, if any."""

    async def sandbox(self) -> dict[str, Any]:
        """The shell's sandbox (gateway/tools/sandbox.py `sandbox_state`)."""

    def next_firing(self, schedule: ScheduleRecord) -> datetime | None: ...

    async def run_job(self, schedule: ScheduleRecord) -> str:
        """Fire the job now (as `gateway jobs run-now`); what happened, in words."""

    async def kill_job(self, schedule: ScheduleRecord) -> str: ...

    async def set_job_enabled(self, schedule: ScheduleRecord, enabled: bool) -> str: ...
