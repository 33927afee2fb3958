"""The spans a turn writes (gateway/telemetry): what each LLM call, tool call, approval wait and
the turn itself say. Attribute names follow OpenTelemetry's GenAI conventions where they have
one (`gen_ai.*`); the gateway's own are `gateway.*`. No message text, arguments or results:
a span says what happened and who decided, the run's events keep the content."""

from __future__ import annotations

from gateway import telemetry
from gateway.agent.audit_trail import Decided
from gateway.events import ThreadKey
from gateway.llm import Usage
from gateway.store import PromptRecord, RunRecord, Store, ToolCallRecord

FINAL_STAGES = ("SUCCESS", "FAILED", "CANCELED")


def llm_call(
    *, requested: str, model: str, started_ns: int, latency_ms: float, first_token_ms: float | None,
    usage: Usage, cost_nano_usd: int | None, round_no: int, tool_calls: int, finish: str,
) -> None:
    if telemetry.current() is None:
        return
    telemetry.record(
        f"chat {model}",
        started_ns,
        started_ns + int(latency_ms * 1_000_000),
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": requested,
            "gen_ai.response.model": model,
            "gen_ai.response.finish_reasons": finish,
            "gen_ai.usage.input_tokens": usage.prompt_tokens,
            "gen_ai.usage.output_tokens": usage.completion_tokens,
            "gen_ai.usage.cache_read.input_tokens": usage.cached_tokens,
            "gateway.llm.reasoning_tokens": usage.reasoning_tokens,
            "gateway.llm.usage_estimated": usage.estimated,
            "gateway.llm.cost_usd": telemetry.usd(cost_nano_usd),
            "gateway.llm.unpriced": cost_nano_usd is None,
            "gateway.llm.time_to_first_token_ms": round(first_token_ms, 2) if first_token_ms is not None else None,
            "gateway.llm.round": round_no,
            "gateway.llm.tool_calls": tool_calls,
        },
    )


def llm_failure(*, requested: str, started_ns: int, round_no: int, error: str) -> None:
    telemetry.record(
        f"chat {requested}", started_ns, None,
        {"gen_ai.operation.name": "chat", "gen_ai.request.model": requested, "gateway.llm.round": round_no},
        error=error,
    )


def tool_call(call: ToolCallRecord, status: str, decided: Decided | None, *, started_ns: int) -> None:
    if telemetry.current() is None:
        return
    telemetry.record(
        f"execute_tool {call.name}",
        started_ns,
        None,
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.call_id,
            "gateway.tool.status": status,
            "gateway.tool.decision": decided.action if decided is not None else "settled",
            "gateway.tool.decided_by": decided.by if decided is not None else None,
            "gateway.tool.decided_via": decided.via if decided is not None else None,
        },
        error=f"the tool failed ({status})" if status == "failed" else None,
    )


def approval_wait(prompt: PromptRecord, decided: Decided) -> None:
    """From the prompt's making (just before it is sent) to its decision: the turn parked meanwhile."""
    if telemetry.current() is None:
        return
    ended = prompt.decided_at
    telemetry.record(
        "approval.wait" if prompt.kind == "approval" else "question.wait",
        telemetry.ns_of(prompt.created_at),
        telemetry.ns_of(ended) if ended is not None else None,
        {
            "gateway.prompt.id": prompt.id,
            "gateway.prompt.kind": prompt.kind,
            "gateway.approval.decision": decided.action,
            "gateway.approval.decided_by": decided.by,
            "gateway.approval.decided_via": decided.via,
            "gen_ai.tool.name": _tool_of(prompt),
        },
    )


def turn(spans: telemetry.RunSpans, run: RunRecord, thread: ThreadKey, *, interactive: bool | None) -> None:
    error = (run.error or run.end_reason or "failed") if run.stage == "FAILED" else None
    spans.end_turn(
        run.started_at,
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.request.model": run.model,
            "gen_ai.usage.input_tokens": run.input_tokens,
            "gen_ai.usage.output_tokens": run.output_tokens,
            "gateway.run.id": run.id,
            "gateway.run.stage": run.stage,
            "gateway.run.end_reason": run.end_reason,
            "gateway.run.llm_calls": run.llm_calls,
            "gateway.run.tool_calls": run.tool_calls,
            "gateway.run.rounds": run.rounds,
            "gateway.run.cost_usd": telemetry.usd(run.cost_nano_usd),
            "gateway.session.id": run.session_id,
            "gateway.thread": run.thread_key,
            "gateway.channel": thread.channel,
            "gateway.interactive": interactive,
        },
        error=error,
    )


async def ended_elsewhere(tel: telemetry.Telemetry | None, store: Store, run_id: int, thread: ThreadKey) -> None:
    """The turn span of a run ended without its turn running (a parked run canceled by /stop)."""
    if tel is None:
        return
    run = await store.runs.get(run_id)
    if run is not None and run.trace_id and run.trace_span_id and run.stage in FINAL_STAGES:
        turn(tel.run(run.trace_id, run.trace_span_id), run, thread, interactive=None)


def _tool_of(prompt: PromptRecord) -> str | None:
    tool = prompt.payload.get("tool") if isinstance(prompt.payload, dict) else None
    return str(tool) if tool else None
