"""`gateway jobs list|show|add|enable|disable|remove|run-now|kill`.

The command works on the database directly; a running gateway notices the change at its next
housekeeping pass. `run-now` and `kill` only put messages into the inbox: the serving gateway
runs the turn (or stops it) and delivers the result.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, TextIO

from gateway.config import Config, SchedulerConfig
from gateway.config.redaction import redact_url
from gateway.events import Delivered, Outbound, Prompt, Submit, utcnow
from gateway.store import Store
from gateway.store.job_spend import Spend
from gateway.store.schedules import JobRunRecord, ScheduleExists, ScheduleRecord
from scheduler import control
from scheduler.checks import EMPTY_HASH, Prober, run_check
from scheduler.definitions import DefinitionError, check_not_past, job_config, to_schedule
from scheduler.jobs import Scheduler
from scheduler.triggers import TriggerError, zone

SUBCOMMANDS = ("list", "show", "add", "enable", "disable", "remove", "run-now", "kill", "test")
# A job's spend today, this week and this month with its forecast, as lines (the composition
# root gives gateway/budgets/jobs.py's; the scheduler does not import the budgets).
SpendLines = Callable[[ScheduleRecord, datetime], Awaitable[list[str]]]


def add_parser(
    subparsers: Any, *, parents: Sequence[argparse.ArgumentParser] = (), handler: Callable[..., Any] | None = None
) -> argparse.ArgumentParser:
    """Add `jobs` to the top-level subparsers (from `parser.add_subparsers()`).

    `parents` (e.g. the common --config/--log-level options) go on every action; `handler`
    becomes the `handler` default of the parsed arguments."""
    common = {"parents": list(parents)}
    jobs = subparsers.add_parser(
        "jobs", help="scheduled jobs: list, show, add, enable, disable, remove, run-now, kill", **common
    )
    if handler is not None:
        jobs.set_defaults(handler=handler)
    actions = jobs.add_subparsers(dest="jobs_command", metavar="ACTION", required=True)
    actions.add_parser("list", help="every job with its next firing and last outcome", **common)
    show = actions.add_parser("show", help="a job's definition and its recent firings", **common)
    show.add_argument("name")
    show.add_argument("--limit", type=int, default=20, help="firings to list (default 20)")
    _add_add_parser(actions, common)
    test = actions.add_parser(
        "test", help="run the job's check once: what it finds and whether the model would wake (stores nothing)",
        **common,
    )
    test.add_argument("name")
    for name, text in (
        ("enable", "switch a job on"),
        ("disable", "switch a job off (history is kept)"),
        ("remove", "delete a job and its history"),
        ("run-now", "fire a job now, outside its schedule"),
        ("kill", "stop the job's running session"),
    ):
        actions.add_parser(name, help=text, **common).add_argument("name")
    return jobs


def _add_add_parser(actions: Any, common: dict[str, Any]) -> None:
    add = actions.add_parser("add", help="create a job", **common)
    add.add_argument("name")
    timing = add.add_mutually_exclusive_group(required=True)
    timing.add_argument("--cron", help="5 fields, e.g. '0 9 * * 1-5'")
    timing.add_argument("--every", help="an interval, e.g. 30m or 2h")
    timing.add_argument("--at", help="an ISO time, e.g. 2025-06-01T09:00")
    timing.add_argument("--in", dest="in_", metavar="DURATION", help="once, after this long, e.g. 20m")
    timing.add_argument("--tick", metavar="INTERVAL", help="a tick every INTERVAL (quiet unless there is news)")
    add.add_argument("--prompt", required=True, help="what the agent should do")
    add.add_argument("--deliver-to", default="none", help="telegram:<chat>[:<topic>], slack:<channel>[:<ts>] or none")
    add.add_argument("--timezone", help="IANA zone (default scheduler.timezone)")
    add.add_argument("--max-rounds", type=int)
    add.add_argument("--max-tokens", type=int)
    add.add_argument("--timeout", help="stop a run after this long, e.g. 10m")
    add.add_argument("--misfire", choices=("run_once", "skip"), default="run_once")
    add.add_argument("--misfire-grace", help="how late a missed firing may still run, e.g. 1h")
    add.add_argument("--no-notify-on-failure", action="store_true")
    add.add_argument("--active-hours", help="ticks only: e.g. 08:00-22:00 in the job's zone")
    add.add_argument("--quiet-sentinel", help="ticks only: the reply that means nothing to report")
    add.add_argument("--disabled", action="store_true", help="create it switched off")
    check = add.add_argument_group("check", "run before the model; the model wakes only when it finds something")
    source = check.add_mutually_exclusive_group()
    source.add_argument("--check-command", metavar="COMMAND", help="a command, run in the shell's sandbox")
    source.add_argument("--check-url", metavar="URL", help="an http(s) URL to GET (web_fetch's rules, ETag)")
    source.add_argument("--check-mcp", metavar="SERVER:TOOL", help="a read-only tool of a trusted MCP server")
    check.add_argument("--check-args", metavar="JSON", help="the MCP tool's arguments, a JSON object")
    check.add_argument("--wake-when", choices=("changed", "nonempty", "exit_zero"), help="default: changed")
    check.add_argument("--check-timeout", metavar="DURATION", help="default 30s")
    check.add_argument("--check-max-output", type=int, metavar="BYTES", help="output kept (default 16384)")
    check.add_argument("--check-network", action="store_true", help="the command may reach the network")
    check.add_argument("--check-failures-before-report", type=int, metavar="N", help="default 3")
    add.add_argument("--checklist", metavar="FILE", help="ticks only: a checklist file the tick works through")
    add.add_argument("--idle-max-every", metavar="INTERVAL", help="stretch an idle job's interval up to this")


async def _no_delivery(message: Outbound | Prompt) -> Delivered:
    raise RuntimeError("the command line does not deliver; the serving gateway does")


async def run_jobs_command(
    args: argparse.Namespace,
    store: Store,
    config: Config | SchedulerConfig,
    submit: Submit,
    *,
    out: TextIO | None = None,
    err: TextIO | None = None,
    now: datetime | None = None,
    checks: Prober | None = None,
    spend: SpendLines | None = None,
) -> int:
    """Run one `gateway jobs ...` command; returns the process exit code."""
    section = config.scheduler if isinstance(config, Config) else config
    cli = _JobsCli(store, section, submit, out or sys.stdout, err or sys.stderr, now or utcnow())
    cli.scheduler.checks = checks  # `test`, and `run-now` of a job with a check
    cli.spend = spend
    return await cli.run(args)


class _JobsCli:
    spend: SpendLines | None = None

    def __init__(self, store: Store, config: SchedulerConfig, submit: Submit, out: TextIO, err: TextIO, now: datetime):
        self.config, self.out, self.err, self.now = config, out, err, now
        self.store = store
        self.scheduler = Scheduler(store, config, submit=submit, deliver=_no_delivery, now=lambda: now)
        self.repo = self.scheduler.repo

    def say(self, text: str) -> None:
        print(text, file=self.out)

    def fail(self, text: str) -> int:
        print(f"error: {text}", file=self.err)
        return 1

    async def run(self, args: argparse.Namespace) -> int:
        report = await self.scheduler.sync_config_jobs()  # so config jobs exist before `serve` ran
        for problem in report.errors:
            print(f"warning: {problem}", file=self.err)
        command = args.jobs_command
        if command == "list":
            return await self.list()
        if command == "add":
            return await self.add(args)
        schedule = await self.repo.by_name(args.name)
        if schedule is None:
            return self.fail(f"no job named {args.name!r} (see `gateway jobs list`)")
        handler = {
            "show": lambda: self.show(schedule, args.limit),
            "enable": lambda: self.switch(schedule, True),
            "disable": lambda: self.switch(schedule, False),
            "remove": lambda: self.remove(schedule),
            "run-now": lambda: self.run_now(schedule),
            "kill": lambda: self.kill(schedule),
            "test": lambda: self.test(schedule),
        }[command]
        return await handler()

    async def list(self) -> int:
        schedules = await self.repo.list()
        if not schedules:
            self.say("no jobs (define them under scheduler.jobs in config.yml or with `gateway jobs add`)")
            return 0
        self.say(f"{'NAME':<20} {'KIND':<5} {'WHEN':<22} {'STATE':<9} {'NEXT':<26} {'LAST':<10} DELIVER TO")
        for s in schedules:
            last = await self.repo.recent_runs(s.id, limit=1)
            state = "on" if s.enabled else "off"
            self.say(
                f"{s.name:<20} {s.kind:<5} {_when(s):<22} {state:<9} {self._next(s):<26} "
                f"{(last[0].status if last else '-'):<10} {s.deliver_to}"
            )
        return 0

    def _next(self, schedule: ScheduleRecord) -> str:
        try:
            fire = control.next_firing(schedule, self.now)
            return _local(fire, schedule.timezone) if fire else "-"
        except TriggerError as exc:
            return f"invalid: {exc}"

    async def show(self, schedule: ScheduleRecord, limit: int) -> int:
        s = schedule
        state = "enabled" if s.enabled else f"disabled ({s.disabled_reason or 'by operator'})"
        self.say(f"{s.name} ({s.kind}): {_when(s)} [{s.timezone}], {state}, source {s.source}")
        self.say(f"  next:        {self._next(s)}")
        self.say(f"  deliver to:  {s.deliver_to}" + (f", in its own topic {s.topic!r}" if s.topic else ""))
        limits = [
            f"{n} {getattr(s, f)}"
            for f, n in (("max_rounds", "rounds"), ("max_tokens", "tokens"), ("timeout_s", "timeout s"))
            if getattr(s, f)
        ]
        grace = s.misfire_grace_s if s.misfire_grace_s is not None else int(self.config.misfire_grace)
        self.say(f"  misfire:     {s.misfire} (grace {grace}s); limits: {', '.join(limits) or 'defaults'}")
        if s.kind == "tick":
            self.say(f"  active:      {s.active_hours or 'always'}; quiet sentinel {s.quiet_sentinel}")
        self.say(f"  prompt:      {s.prompt}")
        if s.check_spec is not None:
            failures = (await self.repo.state(s.id)).failures
            failing = f"; failing {failures} in a row" if failures else ""
            self.say(f"  check:       {_check_text(s.check_spec)}{failing}")
        if self.spend is not None:
            self.say("spend (every model call, quiet ones and sub-agents' included):")
            for line in await self.spend(s, self.now):
                self.say(line)
        runs = await self.repo.recent_runs(s.id, limit=limit)
        spent = await self.store.job_spend.of_sessions([r.session_id for r in runs if r.session_id is not None])
        self.say("recent firings:" if runs else "no firings yet")
        for run in runs:
            self.say("  " + _run_line(run, s.timezone, spent.get(run.session_id or 0)))
        return 0

    async def add(self, args: argparse.Namespace) -> int:
        fields = {
            "name": args.name, "cron": args.cron, "every": args.every or args.tick, "at": args.at, "in": args.in_,
            "kind": "tick" if args.tick else None, "prompt": args.prompt, "deliver_to": args.deliver_to,
            "timezone": args.timezone, "max_rounds": args.max_rounds, "max_tokens": args.max_tokens,
            "timeout": args.timeout, "misfire": args.misfire, "misfire_grace": args.misfire_grace,
            "notify_on_failure": not args.no_notify_on_failure, "enabled": not args.disabled,
            "active_hours": args.active_hours, "quiet_sentinel": args.quiet_sentinel,
        }
        try:
            fields.update(_check_fields(args))
        except ValueError as exc:
            return self.fail(str(exc))
        try:
            new = to_schedule(job_config(fields), self.config, source="cli", now=self.now, created_by="cli")
            check_not_past(new, self.now)
            created = await self.repo.create(new, now=self.now)
        except (DefinitionError, ScheduleExists) as exc:
            return self.fail(str(exc))
        self.say(f"added {created.name}: {created.kind} {_when(created)}; next {self._next(created)}")
        return 0

    async def test(self, schedule: ScheduleRecord) -> int:
        """The job's check, run once against what the last firing left (its hash, a url's ETag),
        storing nothing: the next firing still sees what this one saw."""
        if schedule.check_spec is None:
            return self.fail(f"{schedule.name} has no check: every firing wakes the model")
        if self.scheduler.checks is None:
            return self.fail("checks cannot run from here")
        state = await self.repo.state(schedule.id)
        self.say(f"check of {schedule.name}: {_check_text(schedule.check_spec)}")
        found = await run_check(schedule, state, self.scheduler.checks)
        if found.error is not None:
            after = schedule.check_failures_before_report or self.config.check_failures_before_report
            self.say(f"failed: {found.error}")
            self.say(
                f"a firing now would be recorded failed ({state.failures + 1} in a row; "
                f"deliver_to is told once at {after})"
            )
            return 1
        if found.hash is None:
            self.say("not modified (HTTP 304 to the stored ETag / Last-Modified)")
        else:
            same = "the same as" if found.hash == (state.output_hash or EMPTY_HASH) else "different from"
            cut = ", cut at max_output" if found.cut else ""
            self.say(f"found: {found.bytes} bytes{cut} (sha256 {found.hash[:12]}), {same} the last check's")
        if not found.wake:
            self.say("the model would not wake: the firing would be recorded skipped (no change)")
            return 0
        self.say("the model would wake and be given:")
        shown = found.output if len(found.output) <= 2000 else found.output[:2000] + "\n[...]"
        for line in shown.rstrip().splitlines() or ["(empty)"]:
            self.say(f"  | {line}")
        return 0

    async def switch(self, schedule: ScheduleRecord, enabled: bool) -> int:
        self.say(await control.switch(self.scheduler, schedule, enabled, self.now))
        return 0

    async def remove(self, schedule: ScheduleRecord) -> int:
        await self.repo.remove(schedule.id)
        note = (
            " (it is in config.yml: it comes back at the next start unless removed there)"
            if schedule.source == "config"
            else ""
        )
        self.say(f"removed {schedule.name} and its history{note}")
        return 0

    async def run_now(self, schedule: ScheduleRecord) -> int:
        ok, text = await control.run_now(self.scheduler, schedule, self.now)
        if not ok:
            return self.fail(text)
        self.say(text)
        return 0

    async def kill(self, schedule: ScheduleRecord) -> int:
        self.say(await control.kill(self.scheduler, schedule))
        return 0


def _check_fields(args: argparse.Namespace) -> dict[str, Any]:
    """`check`, `checklist` and `idle_backoff` of `jobs add` from its flags (ValueError: one line)."""
    fields: dict[str, Any] = {
        "checklist": args.checklist,
        "idle_backoff": {"max_every": args.idle_max_every} if args.idle_max_every else None,
        "check_failures_before_report": args.check_failures_before_report,
    }
    check: dict[str, Any] = {}
    if args.check_command is not None:
        check["command"] = args.check_command
    elif args.check_url is not None:
        check["url"] = args.check_url
    elif args.check_mcp is not None:
        server, colon, tool = args.check_mcp.partition(":")
        if not colon:
            raise ValueError(f"--check-mcp {args.check_mcp!r}: use SERVER:TOOL, e.g. --check-mcp mail:unread")
        try:
            arguments = json.loads(args.check_args) if args.check_args else {}
        except json.JSONDecodeError as exc:
            example = '{"folder": "inbox"}'
            raise ValueError(f"--check-args is not JSON ({exc.msg}): give an object, e.g. {example}") from None
        check["mcp"] = {"server": server, "tool": tool, "arguments": arguments}
    options = {
        "wake_when": args.wake_when, "timeout": args.check_timeout, "max_output": args.check_max_output,
        "network": True if args.check_network else None,
    }
    given = {key: value for key, value in options.items() if value is not None}
    if given and not check:
        flags = ", ".join(f"--{key.replace('_', '-')}" for key in given)
        raise ValueError(f"{flags} without a check: add --check-command, --check-url or --check-mcp")
    if check:
        fields["check"] = {**check, **given}
    return fields


def _check_text(spec: dict[str, Any]) -> str:
    if "command" in spec:
        what = "command" + (" (network)" if spec.get("network") else "")
    elif "url" in spec:
        what = f"GET {redact_url(str(spec['url']))}"
    else:
        mcp = spec.get("mcp") or {}
        what = f"MCP {mcp.get('server')}:{mcp.get('tool')}"
    return f"{what}, wake when {spec.get('wake_when', 'changed')}, timeout {spec.get('timeout_s', 30)}s"


def _when(schedule: ScheduleRecord) -> str:
    if schedule.kind == "cron":
        return schedule.spec
    if schedule.kind == "at":
        return _local(datetime.fromisoformat(schedule.spec), schedule.timezone)
    hours = f" {schedule.active_hours}" if schedule.active_hours else ""
    return f"every {schedule.spec}{hours}"


def _local(moment: datetime, tz: str) -> str:
    try:
        return moment.astimezone(zone(tz)).strftime("%Y-%m-%d %H:%M %Z")
    except TriggerError:
        return moment.isoformat(timespec="minutes")


def _run_line(run: JobRunRecord, tz: str, spent: Spend | None = None) -> str:
    took = ""
    if run.started_at and run.finished_at:
        took = f" {(run.finished_at - run.started_at).total_seconds():.0f}s"
    extras = [f"#{run.id}", run.origin if run.origin != "schedule" else ""]
    if spent is not None and spent.calls:  # the firing's runs, its sub-agents' included
        extras.append(_spent_text(spent))
    if run.delivered:
        extras.append(f"delivered {len(run.delivered)}")
    if run.error:
        extras.append(run.error)
    return f"{_local(run.scheduled_for, tz):<22} {run.status:<9}{took:>6}  " + "  ".join(e for e in extras if e)


def _spent_text(spent: Spend) -> str:
    cost = "" if spent.cost_nano_usd is None else f", ${spent.cost_nano_usd / 1e9:.6f}".rstrip("0").rstrip(".")
    calls = f"{spent.calls} call{'s' if spent.calls != 1 else ''}"
    return f"{calls}, {spent.tokens:,} tokens ({spent.cached_tokens:,} cached){cost}"
