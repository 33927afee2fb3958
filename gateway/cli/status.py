"""`gateway status [--json] [--timeout S]`: the gateway on one screen, in seconds.

Which version and config, the database in use and its schema, each chat channel (connected,
the bot's name, the mode), the model server (reachable, the model, the window), the shell's
sandbox, the MCP servers as configured, the instances and the leader (from the database's
leases), the jobs' next firings, and what waits for a person: approvals, pairing requests, the
owner's claim code. Every part is asked at the same time, each with a short timeout, and
nothing is changed (a database not created yet stays so; no MCP server is started), but for the
claim code, made as at start when a channel without an admin has none.

The exit status is 0 when the database, every channel and the model server answered, 1 when one
of them did not (the line says which and what to do); `--json` prints the same as one object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol, TextIO

from gateway.access.claim import current_claim_line
from gateway.access.pairing import describe
from gateway.cli import status_probes as probes
from gateway.cli.database import DatabaseState, opened
from gateway.cli.doctor_parts import JobRules
from gateway.config import Config
from gateway.events import utcnow
from gateway.running.leadership import LEADER_LEASE
from gateway.store import Store
from gateway.store.db import SCHEMA_REVISION
from gateway.store.schedules import ScheduleRecord

TIMEOUT_S = 3.0
SHOWN = 3  # jobs, approvals and pairing requests named on their line; the rest counted
Part = dict[str, Any]


class Timetables(JobRules, Protocol):
    """The scheduler's reading of job timings (scheduler/control.py; gateway/cli may not import it)."""

    def next_firing(self, schedule: ScheduleRecord, now: datetime) -> datetime | None: ...


def add_parser(subparsers: Any, *, parents: Sequence[argparse.ArgumentParser], handler: Callable[..., Any]) -> None:
    status = subparsers.add_parser(
        "status", parents=list(parents), help="the gateway on one screen: channels, model server, database, jobs",
        description="Every part of the gateway asked at once, changing nothing; exits 1 when the database, a "
        "channel or the model server does not answer.",
    )
    status.add_argument("--json", action="store_true", help="print one JSON object (for scripts)")
    status.add_argument("--timeout", type=_seconds, default=TIMEOUT_S, help=f"seconds per part (default {TIMEOUT_S:g})")
    status.set_defaults(handler=handler)


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of seconds above 0, e.g. 5")
    return seconds


async def run(args: argparse.Namespace, config: Config, timetables: Timetables, out: TextIO = sys.stdout) -> int:
    status = await collect(config, timetables, timeout_s=args.timeout)
    print(json.dumps(status, indent=2, default=_json_value) if args.json else "\n".join(render(status)), file=out)
    return 0 if status["ok"] else 1


async def collect(config: Config, timetables: Timetables, *, timeout_s: float = TIMEOUT_S) -> Part:
    """Every part, asked at once: what `--json` prints."""
    now = utcnow()
    stored, channels, model, sandbox, mcp = await asyncio.gather(
        _stored(config, timetables, now, timeout_s),
        probes.channels(config, timeout_s),
        probes.model_server(config.llm, timeout_s),
        asyncio.to_thread(probes.sandbox, config.agent),
        probes.mcp_servers(config.mcp, timeout_s),
    )
    database: Part = stored["database"]
    ok = database["ok"] and all(c["connected"] for c in channels) and model["reachable"] and not model["error"]
    return {
        "version": _version(), "config": _config_file(config.source), "checked_at": now.isoformat(timespec="seconds"),
        **stored, "channels": channels, "model_server": model, "sandbox": sandbox, "mcp": mcp, "ok": ok,
    }


async def _stored(config: Config, timetables: Timetables, now: datetime, timeout_s: float) -> Part:
    """The database's state and what it holds; the jobs of config.yml even when it cannot be read."""
    async with opened(config.database.url, timeout_s) as (state, store):
        part: Part = {"database": _database(state, config.database.auto_migrate), "instances": None, "leader": None,
                      "approvals": None, "pairing": None, "claim": None}
        schedules: list[ScheduleRecord] = []
        if store is not None:
            try:
                part.update(await _held(store, now))
                schedules = await store.schedules.list()
                part["claim"] = (await current_claim_line(store, config)).splitlines()  # while a channel has no admin
            except Exception as exc:  # noqa: BLE001 - an older schema: what cannot be read is shown as unknown
                part["database"]["read_error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        elif not state.created and not state.problem:  # nothing has run yet, so nothing waits
            part.update(instances=[], approvals={"pending": 0, "requests": []}, pairing={"pending": 0, "requests": []})
    part["jobs"] = _jobs(schedules, config, timetables, now)
    return part


def _database(state: DatabaseState, auto_migrate: bool) -> Part:
    """`ok`: serve can start on it (an older schema only when it may migrate it)."""
    usable = not state.problem and not state.ahead and (auto_migrate or state.current or not state.reachable)
    return {
        "url": state.url, "kind": state.kind, "reachable": state.reachable, "created": state.created,
        "revision": state.revision, "head": SCHEMA_REVISION, "current": state.current,
        "ok": usable, "problem": state.problem, "note": state.note, "read_error": "",
    }


async def _held(store: Store, now: datetime) -> Part:
    """Instances and the leader from the leases, pending approvals and pairing requests."""
    beats = await store.console.instances()
    leader = await store.inbox.lease_holder(LEADER_LEASE)
    approvals = await store.prompts.pending(kind="approval")
    requests = await store.access.pending()
    return {
        "instances": [
            {"id": beat.instance_id, "alive": beat.expires_at > now, "leader": leader is not None
             and leader.owner == beat.instance_id, "expires_at": beat.expires_at} for beat in beats
        ],
        "leader": leader.owner if leader is not None else None,
        "approvals": {"pending": len(approvals), "requests": [
            {"id": p.id, "tool": p.payload.get("tool", ""), "thread": p.thread_key, "expires_at": p.expires_at}
            for p in approvals
        ]},
        "pairing": {"pending": len(requests), "requests": [
            {"code": r.code, "who": describe(r, markdown=False), "channel": r.channel, "expires_at": r.expires_at}
            for r in requests
        ]},
    }


def _jobs(schedules: list[ScheduleRecord], config: Config, timetables: Timetables, now: datetime) -> list[Part]:
    """The stored jobs and those of config.yml not stored yet (serve stores them), soonest first."""
    jobs = []
    for schedule in schedules:
        try:
            jobs.append(_job(schedule.name, timetables.next_firing(schedule, now), "", schedule.source))
        except ValueError as exc:  # the scheduler's TriggerError: a stored spec it cannot read
            jobs.append(_job(schedule.name, None, str(exc), schedule.source))
    stored = {schedule.name for schedule in schedules}
    for name, next_firing, problem in timetables.config_jobs(config.scheduler, now):
        if name not in stored or problem:
            jobs = [job for job in jobs if job["name"] != name]
            jobs.append(_job(name, next_firing, problem, "config"))
    return sorted(jobs, key=lambda job: (job["next"] is None, job["next"] or now, job["name"]))


def _job(name: str, next_firing: datetime | None, error: str, source: str) -> Part:
    return {"name": name, "next": next_firing, "error": error, "source": source}


def _json_value(value: object) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _config_file(source: str) -> str:
    return os.path.abspath(source) if source != "<defaults>" else source


def _version() -> str:
    try:
        return version("chat-gateway")
    except PackageNotFoundError:
        return "unknown"


# --- the screen -------------------------------------------------------------------------------


def render(status: Part) -> list[str]:
    lines = [f"gateway {status['version']}, checked {status['checked_at']}"]
    rows = [
        ("config", status["config"] if status["config"] != "<defaults>" else "none (defaults and the environment)"),
        ("database", _database_text(status["database"])),
        *((channel["name"], _channel_text(channel)) for channel in status["channels"]),
        ("model", _model_text(status["model_server"])),
        ("sandbox", status["sandbox"]["found"] + _fix(status["sandbox"]["fix"])),
        ("mcp", _mcp_text(status["mcp"])),
        ("instances", _instances_text(status["instances"], status["leader"])),
        ("jobs", _jobs_text(status["jobs"])),
        ("approvals", _approvals_text(status["approvals"])),
        ("pairing", _pairing_text(status["pairing"])),
    ]
    rows += [("claim", line.removeprefix("claim: ")) for line in status["claim"] or ()]
    return lines + [f"{label:<10} {text}" for label, text in rows]


def _fix(fix: str) -> str:
    return f" -> {fix}" if fix else ""


def _database_text(database: Part) -> str:
    if database["problem"]:
        return f"{database['url']}: {database['problem']}"
    if not database["created"]:
        return f"{database['url']}: not created yet: {database['note']}"
    state = DatabaseState(database["url"], database["kind"], reachable=True, revision=database["revision"])
    unread = f"; cannot read it: {database['read_error']}" if database["read_error"] else ""
    return f"{database['url']}: {state.schema()}{unread}"


def _channel_text(channel: Part) -> str:
    mode = {"socket": "socket mode", "http": "HTTP events"}.get(channel["mode"], channel["mode"])
    if channel["connected"]:
        return f"connected as {channel['bot']}, {mode}"
    return f"not connected ({mode}): {channel['error']}"


def _model_text(model: Part) -> str:
    head = f"{model['base_url']}, model {model['model']}"
    if not model["reachable"]:
        return f"{head}: unreachable: {model['error']}"
    listed = {True: " (listed)", False: " (not listed by the server)", None: ""}[model["listed"]]
    window = f", window {model['window']:,} tokens ({model['window_source']})" if model["window"] else ""
    problem = f"; {model['error']}" if model["error"] else ""
    return f"{head}{listed}: reachable{window}{problem}"


def _mcp_text(servers: list[Part]) -> str:
    if not servers:
        return "none configured"
    each = ", ".join(f"{s['name']} ({s['transport']}: {s['note']})" for s in servers)
    return f"{len(servers)} configured, not started here: {each}"


def _instances_text(instances: list[Part] | None, leader: str | None) -> str:
    if instances is None:
        return "unknown (the database cannot be read)"
    alive = [i for i in instances if i["alive"]]
    if not alive:
        return "none running" + (f" ({len(instances)} stopped or silent)" if instances else "")
    names = ", ".join(i["id"] + (" (leader)" if i["leader"] else "") for i in alive)
    return f"{len(alive)} running: {names}" + ("" if leader else "; no leader right now")


def _jobs_text(jobs: list[Part]) -> str:
    if not jobs:
        return "none"
    said = []
    for job in jobs[:SHOWN]:
        when = f"{job['next']:%Y-%m-%d %H:%M %Z}" if job["next"] else "not scheduled"
        said.append(f"{job['name']}: {job['error']} (gateway doctor)" if job["error"] else f"{job['name']} {when}")
    return "next " + "; ".join(said) + _more(len(jobs))


def _approvals_text(approvals: Part | None) -> str:
    if approvals is None:
        return "unknown (the database cannot be read)"
    if not approvals["pending"]:
        return "none pending"
    named = ", ".join(f"#{a['id']} {a['tool'] or 'a tool'} in {a['thread']}" for a in approvals["requests"][:SHOWN])
    return f"{approvals['pending']} pending: {named}{_more(approvals['pending'])} (gateway approvals list)"


def _pairing_text(pairing: Part | None) -> str:
    if pairing is None:
        return "unknown (the database cannot be read)"
    if not pairing["pending"]:
        return "no requests waiting"
    named = ", ".join(f"{r['code']} {r['who']}" for r in pairing["requests"][:SHOWN])
    first = pairing["requests"][0]["code"]
    return f"{pairing['pending']} waiting: {named}{_more(pairing['pending'])} (gateway pairing approve {first})"


def _more(count: int) -> str:
    return f" and {count - SHOWN} more" if count > SHOWN else ""
