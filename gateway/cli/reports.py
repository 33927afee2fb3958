"""Plain-text reports for the command line: runs, their timelines, sessions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gateway.store import InboxItem, MessageRecord, RunEventRecord, RunRecord, SessionRecord, TaskRecord
from gateway.traces.runs import format_nano_usd


def _duration(run: RunRecord) -> str:
    if run.finished_at is None:
        return "-"
    return f"{(run.finished_at - run.started_at).total_seconds():.2f}s"


def _cost(run: RunRecord) -> str:
    cost = format_nano_usd(run.cost_nano_usd, run.unpriced and run.cost_nano_usd is not None)
    return f"~{cost}" if run.usage_estimated and run.cost_nano_usd is not None else cost


def _tokens(run: RunRecord) -> str:
    """In/out tokens; `~` marks counts the gateway estimated (the server sent no usage)."""
    mark = "~" if run.usage_estimated else ""
    return f"{mark}{run.input_tokens}/{mark}{run.output_tokens}"


def print_runs(runs: Sequence[RunRecord]) -> None:
    print(
        f"{'id':>6}  {'stage':<15}{'end':<15}{'model':<20}{'rounds':>6}{'tokens in/out':>16}  {'cost':<12}{'took':>8}"
        "  thread"
    )
    for run in runs:
        tokens = _tokens(run)
        print(
            f"{run.id:>6}  {run.stage:<15}{run.end_reason or '-':<15}{(run.model or '-')[:19]:<20}{run.rounds:>6}"
            f"{tokens:>16}  {_cost(run):<12}{_duration(run):>8}  {run.thread_key}"
        )


def print_run(run: RunRecord, events: Sequence[RunEventRecord]) -> None:
    print(f"run {run.id}  session {run.session_id}  thread {run.thread_key}")
    print(f"stage {run.stage}  end {run.end_reason or '-'}  model {run.model or '-'}  took {_duration(run)}")
    if run.error:
        print(f"error: {run.error}")
    if run.trace_id:  # the trace's id in a tracing backend (telemetry.otlp_endpoint) and in the log
        print(f"trace {run.trace_id}  turn span {run.trace_span_id}")
    print(
        f"tokens: {run.input_tokens} in ({run.cached_tokens} cached, {run.cache_write_tokens} written to the cache), "
        f"{run.output_tokens} out, "
        f"{run.reasoning_tokens} reasoning; {run.llm_calls} LLM calls, {run.tool_calls} tool calls; cost {_cost(run)}"
        + (" (estimated: the server sent no usage)" if run.usage_estimated else "")
    )
    tally = feedback_tally(events)
    if any(tally.values()):
        print(f"feedback: {tally['up']} 👍  {tally['down']} 👎")
    print("timeline:")
    for event in events:
        offset = (event.at - run.started_at).total_seconds()
        link = f" <- #{event.parent_seq}" if event.parent_seq else ""
        print(f"  #{event.seq:<4} +{offset:8.3f}s  {event.kind:<14}{link}  {event_summary(event.kind, event.payload)}")


def print_children(tree: Sequence[tuple[int, TaskRecord, RunRecord | None]]) -> None:
    """The sub-agents under a run (delegate calls), indented by depth."""
    if not tree:
        return
    print("sub-agents:")
    for level, task, run in tree:
        kind = "background" if task.background else "sync"
        used = f"run {run.id} {run.stage} {run.input_tokens}/{run.output_tokens} tokens" if run else "not started"
        preview = " ".join((task.result or "").split())[:60]
        line = f"  {'  ' * (level - 1)}└ #{task.id} {task.name} ({kind}, {task.status})  {used}"
        print(line + (f"  → {preview}" if preview else ""))


THUMBS = {"up": "👍", "down": "👎"}


def feedback_tally(events: Sequence[RunEventRecord]) -> dict[str, int]:
    """Thumbs up and down standing on the run's replies (taken back ones taken off)."""
    tally = {"up": 0, "down": 0}
    for event in events:
        if event.kind == "FEEDBACK":
            for value in event.payload.get("added") or ():
                tally[value] = tally.get(value, 0) + 1
            for value in event.payload.get("removed") or ():
                tally[value] = tally.get(value, 0) - 1
    return tally


def event_summary(kind: str, payload: dict[str, Any]) -> str:
    if kind == "LLM_REQUEST":
        return (
            f"model {payload.get('model')}  {payload.get('messages')} messages"
            f"  ~{payload.get('estimated_tokens')} tokens"
        )
    if kind == "LLM_RESPONSE":
        usage = payload.get("usage") or {}
        calls = ", ".join(c.get("name", "?") for c in payload.get("tool_calls") or [])
        return (
            f"{payload.get('finish_reason')}  {payload.get('latency_ms')} ms  in {usage.get('input_tokens')} "
            f"out {usage.get('output_tokens')}"
            + (f" cached {usage['cached_tokens']}" if usage.get("cached_tokens") else "")
            + (f"  cost {format_nano_usd(cost)}" if (cost := payload.get("cost_nano_usd")) is not None else "")
            + (f"  calls: {calls}" if calls else "")
        )
    if kind == "TOOL_CALL":
        return f"{payload.get('name')} {payload.get('status')} {payload.get('duration_ms')} ms"
    if kind == "LLM_FALLBACK":
        after = payload.get("after")
        return f"{payload.get('from')} -> {payload.get('to')} after {after} attempt(s): {payload.get('error')}"
    if kind == "TRANSCRIPTION":
        cost = format_nano_usd(payload.get("cost_nano_usd"))
        return f"{payload.get('model')} {payload.get('file')}  {payload.get('seconds')} s  {cost}"
    if kind in ("SUMMARY_CALL", "MCP_SAMPLING"):
        usage = payload.get("usage") or {}
        cost = format_nano_usd(payload.get("cost_nano_usd"))
        return f"{payload.get('model')}  in {usage.get('input_tokens')} out {usage.get('output_tokens')}  {cost}"
    if kind == "FEEDBACK":
        by = payload.get("by_name") or payload.get("by") or "someone"
        marks = [THUMBS.get(v, v) for v in payload.get("added") or ()]
        marks += [f"{THUMBS.get(v, v)} taken back" for v in payload.get("removed") or ()]
        return f"{', '.join(marks)} by {by} on message {payload.get('message_id')}"
    return json.dumps(payload, ensure_ascii=False)[:200]


def print_sessions(sessions: Sequence[SessionRecord]) -> None:
    print(f"{'id':>6}  {'kind':<12}{'source':<10}{'messages':>9}  {'created':<20}thread")
    for session in sessions:
        closed = " (closed)" if session.closed_at else ""
        print(
            f"{session.id:>6}  {session.kind:<12}{session.source:<10}{session.next_seq - 1:>9}"
            f"  {session.created_at:%Y-%m-%d %H:%M:%S}  {session.thread_key}{closed}"
        )


def print_session(
    session: SessionRecord,
    history: Sequence[MessageRecord],
    totals: dict[str, Any],
    dropped: Sequence[InboxItem] = (),
) -> None:
    print(
        f"session {session.id}  {session.kind}  thread {session.thread_key}"
        f"  created {session.created_at:%Y-%m-%d %H:%M:%S}"
    )
    print(
        f"runs {totals.get('runs')}  tokens {totals.get('input_tokens')} in / {totals.get('output_tokens')} out"
        f"  cost {format_nano_usd(totals.get('cost_nano_usd'))}"
    )
    for message in history:
        flags = " (failed)" if message.status != "ok" else ""
        flags += " (notice)" if message.synthetic else ""
        who = message.sender_name or message.role
        print(f"[{message.seq}] {who}{flags}: {message.content}")
        for call in message.tool_calls:
            print(f"    🔧 {call.name}({call.arguments}) -> {call.status}: {(call.result or call.note or '')[:200]}")
    if dropped:
        print(f"dropped unhandled by /stop: {len(dropped)}")
        for item in dropped:
            who = (item.payload.get("sender") or {}).get("name") or "?"
            print(f"    ✂ {who}: {str(item.payload.get('text', ''))[:200]}")
