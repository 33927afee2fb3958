"""The agent's `schedule` tool: create, list and cancel jobs that deliver to the current thread.

Offered only in interactive sessions, and refused in any other even if offered by mistake: a
scheduled run must not be able to schedule more runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

from gateway.config import SchedulerConfig
from gateway.events import utcnow
from gateway.store import Store
from gateway.store.schedules import ScheduleExists, ScheduleRecord
from gateway.tools.registry import ToolContext, ToolError, ToolSpec, matches_any
from scheduler.definitions import DefinitionError, check_not_past, deliver_to_text, job_config, to_schedule
from scheduler.jobs import schedule_repo
from scheduler.triggers import TriggerError, timetable, zone

MAX_JOBS_PER_THREAD = 20
NOT_HERE = (
    "The schedule tool works only in a conversation with a person; scheduled runs cannot create, list or cancel jobs."
)

DESCRIPTION = (
    "Create, list or cancel scheduled jobs whose results are posted in this conversation. A job runs the "
    "prompt later in a fresh, unattended session: tools that need approval are denied there, and the result "
    "offers a button to run it again with approval. Give exactly one of cron (5 fields, in `timezone`), "
    "every (e.g. 30m, 2h), at (ISO time) or in (e.g. 20m, once). A check (a command in the shell's sandbox, a "
    "url, or a read-only MCP tool) runs first at each firing and wakes the job only when its output changed "
    "(or is nonempty, or the command exits 0): a watch costs nothing while nothing happens."
)
CHECK_PARAMETER: dict[str, Any] = {
    "type": "object",
    "description": "optional: what runs before each firing; give exactly one of command, url or mcp",
    "properties": {
        "command": {"type": "string", "description": "a shell command, run sandboxed like the shell tool"},
        "url": {"type": "string", "description": "an http(s) URL to GET"},
        "mcp": {
            "type": "object",
            "properties": {"server": {"type": "string"}, "tool": {"type": "string"}, "arguments": {"type": "object"}},
            "required": ["server", "tool"],
            "additionalProperties": False,
        },
        "wake_when": {"type": "string", "enum": ["changed", "nonempty", "exit_zero"]},
        "timeout": {"type": "string", "description": "e.g. 30s (the default)"},
    },
    "additionalProperties": False,
}

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "action": {"type": "string", "enum": ["create", "list", "cancel"], "description": "what to do"},
        "name": {"type": "string", "description": "the job's unique name: letters, digits, _ . - (create, cancel)"},
        "prompt": {"type": "string", "description": "what the agent should do at each run (create)"},
        "cron": {"type": "string", "description": "5-field cron expression, e.g. '0 9 * * 1-5'"},
        "every": {"type": "string", "description": "an interval, at least 1m, e.g. 30m or 2h"},
        "at": {"type": "string", "description": "one run at this ISO time, e.g. 2025-06-01T09:00"},
        "in": {"type": "string", "description": "one run after this long, e.g. 20m"},
        "timezone": {"type": "string", "description": "IANA zone for cron and at, e.g. Europe/Berlin"},
        "check": CHECK_PARAMETER,
    },
    "required": ["action"],
    "additionalProperties": False,
}

OnChange = Callable[[], Awaitable[None]]
# Whether the person ("<channel>:<user id>") may use the tool by name (their role); the composition
# root gives the access policy's. None: no roles (everyone may use what the agent is offered).
MayUse = Callable[[str, str], bool]


def schedule_tool(
    store: Store,
    config: SchedulerConfig,
    *,
    on_change: OnChange | None = None,
    now: Callable[[], datetime] | None = None,
    may_use: MayUse | None = None,
) -> ToolSpec:
    """The `schedule` tool bound to the store; `on_change` (e.g. `Scheduler.reload`) runs after
    a job is created or cancelled; `may_use` keeps a check within what its creator may run."""
    tool = _ScheduleTool(store, config, on_change, now or utcnow)
    tool.may_use = may_use
    return ToolSpec(name="schedule", description=DESCRIPTION, parameters=PARAMETERS, func=tool, side_effects=True)


class _ScheduleTool:
    may_use: MayUse | None = None

    def __init__(self, store: Store, config: SchedulerConfig, on_change: OnChange | None, now: Callable[[], datetime]):
        self.repo = schedule_repo(store)
        self.config, self.on_change, self.now = config, on_change, now

    async def __call__(self, ctx: ToolContext, args: dict[str, Any]) -> str:
        if not ctx.interactive or ctx.source in ("cron", "tick"):
            raise ToolError(NOT_HERE)
        try:
            target = deliver_to_text(ctx.thread)
        except DefinitionError as exc:
            raise ToolError(str(exc)) from None
        action = args.get("action")
        if action == "create":
            return await self.create(ctx, target, args)
        if action == "list":
            return await self.list(target)
        if action == "cancel":
            return await self.cancel(target, str(args.get("name") or ""))
        raise ToolError(f"action must be create, list or cancel, got {action!r}")

    async def create(self, ctx: ToolContext, target: str, args: dict[str, Any]) -> str:
        mine = await self.repo.list(deliver_to=target, source="agent")
        if len(mine) >= MAX_JOBS_PER_THREAD:
            raise ToolError(f"this conversation already has {len(mine)} jobs (the limit); cancel one first")
        fields = {key: args.get(key) for key in ("name", "prompt", "cron", "every", "at", "in", "timezone")}
        fields["name"] = fields["name"] or ""
        fields["prompt"] = fields["prompt"] or ""
        fields["deliver_to"] = target
        if args.get("check") is not None:
            fields["check"] = self._check(ctx, args["check"])
        moment = self.now()
        try:
            # the person whose turn made it: its runs act for them (their role), not as the scheduler
            creator = ctx.person or str(ctx.thread)
            new = to_schedule(job_config(fields), self.config, source="agent", now=moment, created_by=creator)
            # its runs use the memory of where it was made (a person's DM, a group), nobody else's
            new = replace(new, memory_owner=ctx.memory.owner if ctx.memory is not None else None)
            check_not_past(new, moment)
            created = await self.repo.create(new, now=moment)
        except (DefinitionError, ScheduleExists) as exc:
            raise ToolError(f"{exc}. Fix it and call again.") from None
        await self._changed()
        return (
            f"Scheduled job {created.name!r} ({_when(created)}); next run {_next(created, moment)}. "
            "Results will be posted in this conversation."
        )

    def _check(self, ctx: ToolContext, check: Any) -> dict[str, Any]:
        """A check the agent asks for, kept within what its creator's turn may do: a command only
        where the shell is offered (a sandbox that works, or one the operator turned off) and
        their role may use it, with the shell's network setting (never more); a url only for a
        person who may use web_fetch (under its address rules at every firing); an mcp tool
        only one they may call (and read-only on a trusted server, checked at every firing)."""
        if not isinstance(check, dict):
            raise ToolError("check must be an object with command, url or mcp")
        if "command" in check:
            needed = "shell"
            if not matches_any("shell", ctx.agent.tools):
                raise ToolError("a command check needs the shell, which is not enabled (agent.tools); use a url check")
        elif "url" in check:
            needed = "web_fetch"
        else:
            given = check.get("mcp")
            mcp = given if isinstance(given, dict) else {}
            needed = f"mcp__{mcp.get('server', '')}__{mcp.get('tool', '')}"
        if self.may_use is not None and ctx.person and not self.may_use(ctx.person, needed):
            raise ToolError(f"the check needs {needed}, which your role may not use")
        fields = {key: check[key] for key in ("command", "url", "mcp", "wake_when", "timeout") if key in check}
        if "command" in fields:
            fields["network"] = ctx.agent.shell_network  # the shell's own rule, whatever was asked
        return fields

    async def list(self, target: str) -> str:
        jobs = await self.repo.list(deliver_to=target)
        if not jobs:
            return "No jobs deliver to this conversation."
        moment = self.now()
        lines = [
            f"- {job.name}: {_when(job)}, {'next ' + _next(job, moment) if job.enabled else 'disabled'}"
            f" (source {job.source}): {job.prompt[:80]}"
            for job in jobs
        ]
        return "Jobs delivering to this conversation:\n" + "\n".join(lines)

    async def cancel(self, target: str, name: str) -> str:
        job = await self.repo.by_name(name) if name else None
        if job is None or job.deliver_to != target:
            raise ToolError(f"no job named {name!r} delivers to this conversation; use action list to see them")
        if job.source != "agent":
            raise ToolError(f"job {name!r} was defined by the operator ({job.source}); it can only be changed there")
        await self.repo.remove(job.id)
        await self._changed()
        return f"Cancelled job {name!r}."

    async def _changed(self) -> None:
        if self.on_change is not None:
            await self.on_change()


def _when(job: ScheduleRecord) -> str:
    if job.kind == "cron":
        return f"cron {job.spec} {job.timezone}"
    if job.kind == "at":
        return "once"
    return f"every {job.spec}"


def _next(job: ScheduleRecord, moment: datetime) -> str:
    try:
        table = timetable(job.kind, job.spec, job.timezone, anchor=job.updated_at, active_hours=job.active_hours)
        fire = table.next_after(moment)
    except TriggerError:
        return "unknown"
    return fire.astimezone(zone(job.timezone)).isoformat(timespec="minutes") if fire else "none"
