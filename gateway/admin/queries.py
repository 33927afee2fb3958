"""The data of each console page, read through the store: plain dicts, the same for the HTML
pages and the JSON API."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from gateway.access.cli import configured
from gateway.access.policy import AccessPolicy
from gateway.admin.operations import Operations
from gateway.budgets import budgets_report
from gateway.budgets.jobs import PERIODS, job_spend
from gateway.budgets.jobs import cost_text as job_cost_text
from gateway.cli.reports import event_summary, feedback_tally
from gateway.config import parse_duration
from gateway.config.redaction import redact_error, redact_url, scrub, secret_values
from gateway.store import RunEventRecord, RunRecord, redact
from gateway.store.job_spend import NO_CHANGE, PeriodSpend, Spend
from gateway.store.schedules import JobRunRecord, ScheduleRecord
from gateway.traces.runs import format_nano_usd

LEADER_LEASE = "leader"
RUN_STAGES = ("RUNNING", "AWAITING_INPUT", "SUCCESS", "FAILED", "CANCELED")


def jsonable(value: Any) -> Any:
    """Records and datetimes as JSON values (ISO 8601 times)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def mcp_servers(ops: Operations) -> dict[str, dict[str, Any]]:
    """Each MCP server's state as the console shows it: its target and last error as every page
    shows them (gateway/config/redaction.py), the error also scrubbed of every other configured
    secret (an exception's text may quote any of them)."""
    secrets = secret_values(ops.config)
    return {
        name: {**state, "error": redact(scrub(str(state.get("error") or ""), secrets))}
        for name, state in ops.mcp_summary().items()
    }


async def model_server(ops: Operations) -> dict[str, Any]:
    """The model server as the overview shows it: its URL without credentials or query values,
    its last error and problem with every configured secret scrubbed."""
    state = await ops.model_server()
    secrets = secret_values(ops.config)
    shown = {key: redact_error(str(state.get(key) or ""), secrets) for key in ("error", "problem")}
    return {**state, **shown, "base_url": redact_url(str(state.get("base_url") or ""))}


def shown_run(run: RunRecord, secrets: set[str]) -> RunRecord:
    """A run as the console shows it: its error may quote a URL with its password, or a key."""
    return dataclasses.replace(run, error=redact_error(run.error, secrets)) if run.error else run


def cost_text(run: RunRecord) -> str:
    cost = format_nano_usd(run.cost_nano_usd, run.unpriced and run.cost_nano_usd is not None)
    return f"~{cost}" if run.usage_estimated and run.cost_nano_usd is not None else cost


def took_s(run: RunRecord) -> float | None:
    return (run.finished_at - run.started_at).total_seconds() if run.finished_at else None


async def overview(ops: Operations) -> dict[str, Any]:
    store, config = ops.store, ops.config
    now = datetime.now(UTC)
    leader = await store.inbox.lease_holder(LEADER_LEASE)
    ttl = timedelta(seconds=config.inbox.lease_ttl_s)
    instances = [
        {
            "id": beat.instance_id,
            "role": "leader" if leader and leader.owner == beat.instance_id else "follower",
            "last_heartbeat": beat.expires_at - ttl,
            "alive": beat.expires_at > now,
            "this": beat.instance_id == ops.instance_id,
        }
        for beat in await store.console.instances()
    ]
    gauges = await store.gauges.read(timedelta(seconds=config.outbox.sweep_after_s))
    pending, oldest = gauges.inbox_pending, gauges.inbox_oldest
    counts = await store.console.counts(stuck_after=timedelta(seconds=config.outbox.sweep_after_s), now=now)
    return {
        "now": now,
        "instance": ops.instance_id,
        "leader": leader.owner if leader else None,
        "instances": instances,
        "channels": ops.channel_states(),
        "mcp": mcp_servers(ops),
        "inbox": {"pending": pending, "oldest_age_s": (now - oldest).total_seconds() if oldest else 0.0},
        "stuck_outbox": counts.stuck_outbox,
        "turns_running": counts.turns_running,
        "awaiting_input": counts.awaiting_input,
        "errors_last_hour": counts.errors_last_hour,
        "spend": await budgets_report(store, config, now),
        "model_server": await model_server(ops),
        "sandbox": await ops.sandbox(),
    }


def _timeline(run: RunRecord, events: list[RunEventRecord], secrets: set[str]) -> list[dict[str, Any]]:
    rows = []
    for event in events:
        payload = event.payload
        usage = payload.get("usage") or {}
        rows.append(
            {
                "seq": event.seq,
                "kind": event.kind,
                "at": event.at,
                "offset_s": (event.at - run.started_at).total_seconds(),
                "duration_ms": payload.get("duration_ms", payload.get("latency_ms")),
                "parent_seq": event.parent_seq,
                "context_tokens": usage.get("input_tokens") if event.kind == "LLM_RESPONSE" else None,
                "summary": redact_error(event_summary(event.kind, payload), secrets),
            }
        )
    return rows


async def run_detail(ops: Operations, run_id: int) -> dict[str, Any] | None:
    store = ops.store
    run = await store.runs.get(run_id)
    if run is None:
        return None
    events = await store.runs.events(run.id)
    secrets = secret_values(ops.config)
    run = shown_run(run, secrets)
    children = []
    for level, task in await store.delegations.tree(run.id):
        child = await store.runs.get(task.child_run_id or 0)
        children.append({"level": level, "task": task, "run": child})
    rounds = [
        {"round": i + 1, "context_tokens": (e.payload.get("usage") or {}).get("input_tokens"),
         "estimated_tokens": None}
        for i, e in enumerate(e for e in events if e.kind == "LLM_RESPONSE")
    ]
    estimates = [e.payload.get("estimated_tokens") for e in events if e.kind == "LLM_REQUEST"]
    for row, estimate in zip(rounds, estimates, strict=False):
        row["estimated_tokens"] = estimate
    return {
        "run": run,
        "cost": cost_text(run),
        "took_s": took_s(run),
        "timeline": _timeline(run, events, secrets),
        "feedback": feedback_tally(events),
        "rounds": rounds,
        "children": children,
    }


async def runs(ops: Operations, query: Mapping[str, str]) -> dict[str, Any]:
    """Runs by stage, and finished since a moment (`since`: as the audit's): what the overview's
    tiles count. A run awaiting input shows the prompt it waits for. ValueError on a bad filter."""
    stage = query.get("stage", "").strip().upper()
    if stage and stage not in RUN_STAGES:
        raise ValueError(f"stage: expected one of {', '.join(RUN_STAGES)}, got {stage!r}")
    since = query.get("since", "").strip()
    found = await ops.store.console.runs(stage=stage or None, finished_after=parse_since(since, datetime.now(UTC)))
    awaiting = any(run.stage == "AWAITING_INPUT" for run in found)
    waits = {p.run_id: p for p in await ops.store.prompts.pending()} if awaiting else {}
    secrets = secret_values(ops.config)
    rows = [
        {"run": shown_run(run, secrets), "cost": cost_text(run), "took_s": took_s(run),
         "waits_for": _waits_for(waits.get(run.id))}
        for run in found
    ]
    return {"filters": {"stage": stage, "since": since}, "runs": rows}


def empty_runs(query: Mapping[str, str]) -> dict[str, Any]:
    return {"filters": {"stage": query.get("stage", ""), "since": query.get("since", "")}, "runs": []}


def _waits_for(prompt: Any) -> str:
    if prompt is None:
        return ""
    payload = prompt.payload
    if prompt.kind == "approval":
        return f"approval of {payload.get('tool', '?')}"
    return f"an answer: {payload.get('question', '')}"[:200]


async def queues(ops: Operations) -> dict[str, Any]:
    """The rows behind the overview's inbox depth and stuck outbox counts."""
    console, now = ops.store.console, datetime.now(UTC)
    stuck_after = timedelta(seconds=ops.config.outbox.sweep_after_s)
    waiting = await console.waiting_threads()
    stuck = await console.stuck_outbox(stuck_after=stuck_after, now=now)
    secrets = secret_values(ops.config)
    return {
        "inbox": [{**dataclasses.asdict(t), "age_s": (now - t.oldest).total_seconds()} for t in waiting],
        "outbox": [
            {"id": r.id, "thread_key": r.thread_key, "kind": r.kind, "attempts": r.attempts, "created_at": r.created_at,
             "retry_at": r.retry_at, "error": redact_error(r.error or "", secrets), "uncertain": r.uncertain or ""}
            for r in stuck
        ],
        "stuck_after_s": stuck_after.total_seconds(),
    }


async def approvals(ops: Operations) -> dict[str, Any]:
    store = ops.store
    return {
        "pending": await store.prompts.pending(kind="approval"),
        "decided": await store.console.decided_prompts(kind="approval"),
    }


async def sessions(ops: Operations, search: str = "") -> dict[str, Any]:
    return {"search": search, "sessions": await ops.store.console.search_sessions(search.strip())}


async def session_detail(ops: Operations, session_id: int) -> dict[str, Any] | None:
    store = ops.store
    session = await store.sessions.get(session_id)
    if session is None:
        return None
    runs = await store.runs.list(session_id=session.id, limit=100)
    return {
        "session": session,
        "history": await store.sessions.history(session.id),
        "runs": [{"run": run, "cost": cost_text(run), "took_s": took_s(run)} for run in runs],
        "totals": await store.runs.session_totals(session.id),
    }


async def jobs(ops: Operations) -> dict[str, Any]:
    """Each job with its spend (today, this week, this month, the forecast) and its recent
    firings: woken or skipped (no change), each with its model calls, tokens and cost. Errors
    and check output are shown as every page shows them: URL credentials and secrets masked."""
    store, repo = ops.store, ops.store.schedules
    zone, now, secrets = ZoneInfo(ops.config.scheduler.timezone), datetime.now(UTC), secret_values(ops.config)
    rows = []
    for schedule in await repo.list():
        history = await repo.recent_runs(schedule.id, limit=10)
        spent = await store.job_spend.of_sessions([r.session_id for r in history if r.session_id is not None])
        found = await job_spend(store, schedule, zone, now)
        rows.append(
            {
                "schedule": shown_schedule(schedule, secrets),
                "next_firing": ops.next_firing(schedule),
                "history": [_firing(run, spent.get(run.session_id or 0), secrets) for run in history],
                "running": [run.id for run in await repo.running(schedule.id)],
                "spend": [_period(name, found.periods[name]) for name in PERIODS],
                "forecast": found.forecast.text(),
            }
        )
    return {"jobs": rows, "timezone": zone.key}


def shown_schedule(schedule: ScheduleRecord, secrets: set[str]) -> ScheduleRecord:
    """A job as the console shows it: its prompt and its check (a command line, a URL, an MCP
    tool's arguments) may quote a password or a key."""
    check = schedule.check_spec
    return dataclasses.replace(
        schedule,
        prompt=redact_error(schedule.prompt, secrets),
        check_spec=None if check is None else _masked(check, secrets),
    )


def _masked(value: Any, secrets: set[str]) -> Any:
    if isinstance(value, dict):
        return {key: _masked(item, secrets) for key, item in value.items()}
    if isinstance(value, list):
        return [_masked(item, secrets) for item in value]
    return redact_error(value, secrets) if isinstance(value, str) else value


def _firing(run: JobRunRecord, spent: Spend | None, secrets: set[str]) -> dict[str, Any]:
    """A firing's row: its status in words ("skipped (no change)"), what its runs spent."""
    skipped_no_change = run.status == "skipped" and (run.error or "").startswith(NO_CHANGE)
    spent = spent or Spend()
    return {
        "id": run.id, "scheduled_for": run.scheduled_for, "origin": run.origin, "run_id": run.run_id,
        "status": "skipped (no change)" if skipped_no_change else run.status,
        "took_s": (run.finished_at - run.started_at).total_seconds() if run.started_at and run.finished_at else None,
        "calls": spent.calls, "tokens": spent.tokens, "cached_tokens": spent.cached_tokens,
        "cost": job_cost_text(spent) if spent.calls else "–",
        "note": "" if skipped_no_change else redact_error(run.error or "", secrets),
    }


def _period(name: str, period: PeriodSpend) -> dict[str, Any]:
    s, f = period.spend, period.firings
    return {
        "period": name, "since": period.since, "firings": f.total, "woke": f.woke, "skipped": f.no_change,
        "calls_saved": f.calls_saved, "capped": f.capped, "calls": s.calls, "input_tokens": s.input_tokens,
        "cached_tokens": s.cached_tokens, "output_tokens": s.output_tokens, "cost": job_cost_text(s),
        "cost_nano_usd": s.cost_nano_usd,
    }


async def access(ops: Operations) -> dict[str, Any]:
    store, config = ops.store, ops.config
    policy = AccessPolicy(config)
    grants = [
        {"grant": grant, "role": policy.role_name(grant.channel, grant.subject) if grant.kind == "user" else ""}
        for grant in await store.access.grants()
    ]
    return {
        "dm_policy": config.access.dm_policy,
        "group_policy": config.access.group_policy,
        "pending": await store.access.pending(),
        "grants": grants,
        "configured": [{"kind": k, "who": w, "where": where} for k, w, where in configured(config, policy)],
        "roles": {name: role.model_dump() for name, role in config.access.roles.items()},
    }


AUDIT_FILTERS = ("since", "user", "tool", "kind")


def parse_since(text: str, now: datetime) -> datetime | None:
    """`1h`, `2d`, `90m` back from now, or an ISO time; empty: no bound."""
    text = text.strip()
    if not text:
        return None
    try:
        return now - timedelta(seconds=parse_duration(text))
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"since: expected a duration like 1h or 2d, or an ISO time, got {text!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def empty_audit(query: Mapping[str, str]) -> dict[str, Any]:
    return {"filters": {name: query.get(name, "") for name in AUDIT_FILTERS}, "entries": []}


async def audit(ops: Operations, query: Mapping[str, str]) -> dict[str, Any]:
    filters = {name: query.get(name, "").strip() for name in AUDIT_FILTERS}
    limit = int(query.get("limit", "200") or 200)
    entries = await ops.store.audit.list_audit(
        since=parse_since(filters["since"], datetime.now(UTC)),
        user=filters["user"] or None,
        tool=filters["tool"] or None,
        kind=filters["kind"] or None,
        limit=min(max(limit, 1), 1000),
    )
    return {"filters": filters, "entries": entries}


async def memory(ops: Operations, owner: str) -> dict[str, Any]:
    """Whose memory holds what: every owner (a person, a chat, a job), and one owner's entries."""
    store = ops.store
    return {
        "owners": await store.memory.owners(),
        "owner": owner,
        "entries": await store.memory.list([owner]) if owner else [],
        "enabled": ops.config.memory.enabled,
    }
