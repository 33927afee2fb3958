"""Traces exported over OTLP/HTTP, end to end through Telegram and Slack: an approved tool call
arrives at an OTLP receiver on loopback (the collector's protocol, decoded with the protocol's
own types) as one trace, whose ids the run record holds; a collector that stalls or is down
holds no turn up. On SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fakes.otlp import OtlpReceiver, ReceivedSpan
from test_slack_e2e import ask_for_write as ask_in_slack
from test_slack_e2e import running as running_slack
from test_slack_e2e import slack_config
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import PRIVATE, ask_for_write, button, running, settle, texts, tg_config

from gateway.config import Config, ModelPrice
from gateway.serving.logs import FORMAT, TraceFormatter, TraceIds
from gateway.store import RunRecord, Store

PRICES = {"test-model": ModelPrice(input=1.0, output=2.0)}


def priced(config: Config) -> Config:
    config.llm.prices = PRICES
    return config


def telemetry(otlp: OtlpReceiver, **extra: Any) -> dict[str, Any]:
    return {
        "otlp_endpoint": otlp.url,
        "otlp_headers": {"Authorization": "Bearer collector-token-1"},
        "service_name": "gateway-under-test",
        "resource_attributes": {"deployment.environment": "test"},
        "export_interval": 0.05,
        **extra,
    }


async def one_run(store: Store) -> RunRecord:
    runs = await store.runs.list()
    assert len(runs) == 1
    return runs[0]


def by_operation(spans: list[ReceivedSpan], operation: str) -> list[ReceivedSpan]:
    found = [s for s in spans if s.attributes.get("gen_ai.operation.name") == operation]
    return sorted(found, key=lambda s: s.start_ns)


def named(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def check_approved_call_trace(otlp: OtlpReceiver, run: RunRecord, channel: str, approver: str) -> None:
    """One trace: the turn span (the run record's ids) and, under it, both LLM calls, the
    approval wait, the tool call with its decision and decider, and the sends."""
    assert run.trace_id and run.trace_span_id
    assert {s.trace_id for s in otlp.spans} == {run.trace_id}
    spans = otlp.trace(run.trace_id)
    [turn] = [s for s in spans if not s.parent_span_id]
    assert (turn.name, turn.span_id) == ("turn", run.trace_span_id)
    assert turn.attributes["gateway.run.id"] == run.id and turn.attributes["gateway.run.stage"] == "SUCCESS"
    assert turn.attributes["gateway.channel"] == channel and turn.attributes["gateway.run.tool_calls"] == 1
    assert turn.attributes["gen_ai.usage.input_tokens"] == run.input_tokens > 0
    assert turn.status == "STATUS_CODE_UNSET"
    assert all(s.parent_span_id == turn.span_id for s in spans if s is not turn)

    first, second = by_operation(spans, "chat")
    for call in (first, second):
        assert call.name == "chat test-model" and call.kind == "SPAN_KIND_CLIENT"
        assert call.attributes["gen_ai.request.model"] == "test-model"
        assert call.attributes["gen_ai.usage.input_tokens"] > 0 and call.attributes["gen_ai.usage.output_tokens"] > 0
        assert call.attributes["gateway.llm.cost_usd"] > 0
        assert 0 <= call.attributes["gateway.llm.time_to_first_token_ms"]
    assert first.attributes["gen_ai.response.finish_reasons"] == "tool_calls"
    assert second.attributes["gen_ai.response.finish_reasons"] == "stop"

    [wait] = named(spans, "approval.wait")
    assert wait.attributes["gateway.approval.decision"] == "approved"
    assert wait.attributes["gateway.approval.decided_by"] == approver
    assert wait.attributes["gen_ai.tool.name"] == "write_file"
    [tool] = by_operation(spans, "execute_tool")
    assert tool.name == "execute_tool write_file"
    assert tool.attributes["gateway.tool.decision"] == "approved"
    assert tool.attributes["gateway.tool.decided_by"] == approver
    assert tool.attributes["gateway.tool.decided_via"] == "button"
    assert tool.attributes["gateway.tool.status"] == "done"
    # In the order they happened, inside the turn: the ask, the wait for a person, the call, the answer.
    assert turn.start_ns <= first.start_ns <= first.end_ns <= wait.start_ns < wait.end_ns
    assert wait.end_ns <= tool.start_ns <= tool.end_ns <= second.start_ns <= second.end_ns <= turn.end_ns

    sends = [s for s in spans if s.name.startswith("send ")]
    assert {"send prompt", "send message"} <= {s.name for s in sends}
    assert all(s.attributes["messaging.system"] == channel and s.status != "STATUS_CODE_ERROR" for s in sends)
    [prompt] = named(spans, "send prompt")
    assert prompt.end_ns <= wait.end_ns and prompt.attributes["messaging.message.id"]

    resource = turn.resource
    assert resource["service.name"] == "gateway-under-test" and resource["deployment.environment"] == "test"
    assert resource["service.instance.id"] and resource["service.version"]
    assert all(r.get("Authorization") == "Bearer collector-token-1" for r in otlp.requests)
    # Only what happened and who decided: no arguments, results or message text.
    assert not any("hello" in str(v) or "note.txt" in str(v) for s in spans for v in s.attributes.values())


def trace_complete(otlp: OtlpReceiver) -> bool:
    return any(s.name == "turn" for s in otlp.spans)


async def test_an_approved_tool_call_through_telegram_is_one_trace(store, llm, tg, otlp, tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway.agent.turn")
    caplog.handler.addFilter(TraceIds())
    config = priced(tg_config(llm, tg, tmp_path, telemetry=telemetry(otlp)))
    async with running(store, config) as gateway:
        prompt = await ask_for_write(gateway, llm, tg)
        parked = await one_run(store)
        assert parked.stage == "AWAITING_INPUT" and not any(s.name == "turn" for s in otlp.spans)
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
        await settle(gateway, lambda: "Written." in texts(tg, PRIVATE))
        await otlp.wait_for(lambda: trace_complete(otlp))
    run = await one_run(store)
    assert run.stage == "SUCCESS" and run.trace_id == parked.trace_id
    check_approved_call_trace(otlp, run, "telegram", "telegram:42")
    # The log lines of the run name its trace.
    ended = [r for r in caplog.records if r.getMessage().endswith("SUCCESS (reply)")]
    assert ended and all(r.trace_id == run.trace_id for r in ended)
    assert TraceFormatter(FORMAT).format(ended[-1]).endswith(f" trace_id={run.trace_id}")


async def test_an_approved_tool_call_through_slack_is_one_trace(store, llm, slack, otlp, tmp_path) -> None:
    config = priced(slack_config(llm, slack, tmp_path, telemetry=telemetry(otlp)))
    async with running_slack(store, config, slack) as s:
        _, prompt = await ask_in_slack(s, llm)
        await s.click(prompt, "Approve")
        await s.settle(lambda: "Written." in slack_texts(slack))
        await otlp.wait_for(lambda: trace_complete(otlp))
    check_approved_call_trace(otlp, await one_run(store), "slack", "slack:U1")


async def test_a_parked_run_stopped_with_slash_stop_ends_its_trace(store, llm, tg, otlp, tmp_path) -> None:
    async with running(store, tg_config(llm, tg, tmp_path, telemetry=telemetry(otlp))) as gateway:
        await ask_for_write(gateway, llm, tg)
        tg.private_message(PRIVATE, "/stop")
        await otlp.wait_for(lambda: trace_complete(otlp))
    run = await one_run(store)
    [turn] = [s for s in otlp.trace(run.trace_id) if s.span_id == run.trace_span_id]
    assert (turn.name, turn.attributes["gateway.run.stage"], turn.parent_span_id) == ("turn", "CANCELED", "")
    assert {s.parent_span_id for s in otlp.trace(run.trace_id) if s is not turn} == {run.trace_span_id}


@pytest.mark.parametrize("collector", ["stalled", "refusing", "absent"])
async def test_a_collector_that_stalls_or_is_down_holds_no_turn_up(collector, store, llm, tg, otlp, tmp_path) -> None:
    """The exporter works in its own thread with a bounded queue: turns go on whatever the
    collector does, what does not fit in the queue is dropped, and the stop waits only so long."""
    endpoint = otlp.url
    if collector == "stalled":
        otlp.released.clear()  # every export request is held open
    elif collector == "refusing":
        otlp.refuse_with = 503
    else:
        await otlp.__aexit__()  # nothing listens there any more
    # A long interval: a batch goes out when two spans wait (the first two, held by a stalled
    # collector), and the queue keeps the last four of the many spans that follow.
    settings = telemetry(otlp, otlp_endpoint=endpoint, export_interval=60, max_batch=2, max_queue=4)
    config = tg_config(llm, tg, tmp_path, telemetry={**settings, "export_timeout": 30, "shutdown_timeout": 0.5})
    async with running(store, config) as gateway:
        for n in range(2):
            await ask_for_write(gateway, llm, tg)
            [prompt] = [m for m in tg.bot_messages(PRIVATE) if m.buttons]  # the one still open
            tg.press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
            await settle(gateway, lambda n=n: texts(tg, PRIVATE).count("Written.") == n + 1)
        second, first = await store.runs.list()
        assert (first.stage, second.stage) == ("SUCCESS", "SUCCESS")
        assert otlp.spans == []
        if collector == "stalled":
            assert otlp.stalled == 1  # the exporter tried, once, and is still waiting
            otlp.released.set()
            await otlp.wait_for(lambda: any(s.span_id == second.trace_span_id for s in otlp.spans))
    if collector == "stalled":
        # The two held spans and the queue's four: the rest (the first turn's own span among
        # them) were dropped, not kept waiting for the collector.
        assert len(otlp.spans) == 6
        assert [s.name for s in otlp.spans[:2]] == ["chat test-model", "send prompt"]
        assert {s.trace_id for s in otlp.spans[:2]} == {first.trace_id}
        assert not any(s.span_id == first.trace_span_id for s in otlp.spans)


async def test_the_start_line_names_the_collector_without_its_credentials() -> None:
    from gateway.config import TelemetryConfig
    from gateway.telemetry import build

    config = TelemetryConfig(otlp_endpoint="https://user:pw-1234@otel.example:4318", otlp_headers={"X-Key": "k-5678"})
    exporter = build(config, instance_id="test:1")
    assert exporter is not None and build(TelemetryConfig(), instance_id="test:1") is None
    try:
        shown = exporter.describe()
        assert shown.startswith("traces to https://••••@otel.example:4318/v1/traces (OTLP/HTTP")
        assert "pw-1234" not in shown and "k-5678" not in shown
    finally:
        await exporter.shutdown()
