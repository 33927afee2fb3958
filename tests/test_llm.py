"""The streaming LLM client against the scripted fake server (real HTTP on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import socket

import httpx
import pytest
from fakes.llm import FakeLLM

from gateway.config import LLMConfig
from gateway.llm import (
    AuthError,
    Completion,
    ContextTooLong,
    Finish,
    LLMClient,
    LLMError,
    LLMUnavailable,
    ModelInfo,
    RateLimited,
    ReasoningDelta,
    RetryNotice,
    StreamInterrupted,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
    classify_error,
    parse_retry_after,
)

USER = [{"role": "user", "content": "hi"}]
BASE = 0.01  # backoff base for tests


class FakeTime:
    """Injected clock and sleep: records every wait and advances the clock by it."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
async def fake():
    async with FakeLLM(chunk_chars=4) as llm:
        yield llm


@pytest.fixture
def clock() -> FakeTime:
    return FakeTime()


@pytest.fixture
def notices() -> list[RetryNotice]:
    return []


@pytest.fixture
async def make_client(fake, clock, notices):
    clients: list[LLMClient] = []

    def make(base_url: str | None = None, **settings) -> LLMClient:
        settings.setdefault("model", "m1")
        config = LLMConfig(base_url=base_url or fake.base_url, **settings)
        client = LLMClient(
            config, on_retry=notices.append, backoff_base_s=BASE, sleep=clock.sleep, clock=clock.clock,
            rng=random.Random(7),
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


async def events_of(client: LLMClient, messages=USER, **kwargs) -> list:
    return [event async for event in client.stream(messages, **kwargs)]


# --- streaming ---


async def test_text_reply_streams_model_info_text_finish_and_usage(fake, make_client):
    fake.reply("Hello there, world")
    events = await events_of(make_client(api_key="sk-test"))

    assert events[0] == ModelInfo("m1", served="m1", attempts=1)
    texts = [e.text for e in events if isinstance(e, TextDelta)]
    assert len(texts) > 1 and "".join(texts) == "Hello there, world"
    assert [e for e in events if isinstance(e, Finish)] == [Finish("stop")]
    assert isinstance(events[-1], Usage) and events[-1].prompt_tokens > 0
    body = fake.requests[0]
    assert body["model"] == "m1" and body["messages"] == USER
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert fake.headers[0]["Authorization"] == "Bearer sk-test"


async def test_no_authorization_header_without_api_key(fake, make_client):
    await events_of(make_client(api_key=""))
    assert "Authorization" not in fake.headers[0]


async def test_model_info_reports_the_served_name(fake, make_client):
    fake.reply("hi", model="llama-3.1-8b-instruct-q4.gguf")
    events = await events_of(make_client())
    assert events[0] == ModelInfo("m1", served="llama-3.1-8b-instruct-q4.gguf", attempts=1)


async def test_tools_max_tokens_and_temperature_are_sent(fake, make_client):
    tools = [{"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}}]
    await events_of(make_client(temperature=0.2, max_tokens=999), tools=tools, max_tokens=50)
    body = fake.requests[0]
    assert body["tools"] == tools and body["max_tokens"] == 50 and body["temperature"] == 0.2


async def test_split_tool_calls_are_reassembled(fake, make_client):
    first = {"tz": "Europe/Oslo"}
    second = {"path": "notes/today.md", "lines": [1, 2, 3]}
    fake.tool_calls(("clock", first, "call_a"), ("read_file", second, "call_b"), text="Let me check.")
    client = make_client()
    events = await events_of(client)

    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    for index in (0, 1):
        mine = [d for d in deltas if d.index == index]
        assert len([d for d in mine if d.arguments]) >= 3  # arguments really came in pieces
        assert len([d for d in mine if d.id]) == 1 and len([d for d in mine if d.name]) == 1

    fake.tool_calls(("clock", first, "call_a"), ("read_file", second, "call_b"), text="Let me check.")
    done = await client.complete(USER)
    assert done.text == "Let me check." and done.finish_reason == "tool_calls"
    assert done.tool_calls == (
        ToolCall("call_a", "clock", json.dumps(first)), ToolCall("call_b", "read_file", json.dumps(second)),
    )


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_is_reported_apart_from_text(fake, make_client, field):
    fake.reasoning("The user greets me; answer briefly.", "Hi!", field=field)
    done = await make_client().complete(USER)
    assert done.reasoning == "The user greets me; answer briefly."
    assert done.text == "Hi!"


async def test_reasoning_sent_in_both_fields_is_not_doubled(fake, make_client):
    delta = {"reasoning": "think", "reasoning_content": "think", "content": "ok"}
    fake.raw(f'data: {json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": "stop"}]})}', "")
    events = await events_of(make_client())
    assert [e for e in events if isinstance(e, ReasoningDelta)] == [ReasoningDelta("think")]


async def test_usage_details_are_parsed(fake, make_client):
    usage = {
        "prompt_tokens": 1200, "completion_tokens": 80, "total_tokens": 1280,
        "prompt_tokens_details": {"cached_tokens": 1024}, "completion_tokens_details": {"reasoning_tokens": 33},
    }
    fake.reply("ok", usage=usage)
    done = await make_client().complete(USER)
    assert done.usage == Usage(prompt_tokens=1200, completion_tokens=80, cached_tokens=1024, reasoning_tokens=33)


async def test_finish_reason_length_is_passed_on(fake, make_client):
    fake.reply("This answer was cut", finish_reason="length")
    done = await make_client().complete(USER)
    assert done.finish_reason == "length" and done.text == "This answer was cut"


async def test_sse_comments_multiline_data_and_calls_without_index(fake, make_client):
    first = {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "clock", "arguments": '{"tz"'}}]}}]}
    again = {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"id": "c1", "function": {"name": "clock", "arguments": ': "UTC"}'}}]}}]}
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    split = json.dumps(finish).replace(', "finish_reason"', '\ndata: , "finish_reason"')
    fake.raw(": ping", "", f"data: {json.dumps(first)}", "", ": keep-alive", f"data: {json.dumps(again)}", "",
             f"data: {split}", "", "data: [DONE]", "")
    events = await events_of(make_client())
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert deltas == [ToolCallDelta(0, "c1", "clock", '{"tz"'), ToolCallDelta(0, "", "", ': "UTC"}')]
    assert events[-1] == Finish("tool_calls")


async def test_malformed_chunk_is_a_clear_error(fake, make_client):
    fake.raw("data: {not json", "")
    with pytest.raises(LLMError, match="malformed stream chunk") as caught:
        await events_of(make_client())
    assert caught.value.kind == "stream" and len(fake.requests) == 1


async def test_unicode_separators_inside_the_json_are_not_line_ends(fake, make_client):
    text = "one\u2028two\u2029three\u0085four"
    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]}
    fake.raw(f"data: {json.dumps(chunk, ensure_ascii=False)}", "", "data: [DONE]", "")
    done = await make_client().complete(USER)
    assert done.text == text and done.finish_reason == "stop"


async def test_cr_and_crlf_line_ends(fake, make_client):
    text = {"choices": [{"index": 0, "delta": {"content": "über"}}]}
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    fake.raw(f"data: {json.dumps(text)}\r\rdata: {json.dumps(finish)}\r\n\r\ndata: [DONE]\r")
    done = await make_client().complete(USER)
    assert done.text == "über" and done.finish_reason == "stop"


async def test_the_body_is_json_and_what_orjson_refuses_is_still_sent(fake, make_client):
    messages = [{"role": "user", "content": "hi \u00e9\U0001f600", "meta": {1: 2**70, None: True}}]
    await events_of(make_client(), messages=messages)
    assert fake.headers[0]["Content-Type"] == "application/json"
    assert fake.headers[0]["Accept"] == "text/event-stream"
    assert fake.requests[0]["messages"] == [
        {"role": "user", "content": "hi \u00e9\U0001f600", "meta": {"1": 2**70, "null": True}}
    ]


class ConnectionRecorder(httpx.AsyncBaseTransport):
    """A real HTTP transport that notes the local address of the connection each request used."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.local_addresses: list[object] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        self.local_addresses.append(response.extensions["network_stream"].get_extra_info("client_addr"))
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_finished_stream_leaves_its_connection_reusable(fake):
    recorder = ConnectionRecorder()
    async with LLMClient(LLMConfig(base_url=fake.base_url), transport=recorder) as client:
        for _ in range(3):
            assert (await client.complete(USER)).text == "ok"
    assert len(recorder.local_addresses) == 3 and len(set(recorder.local_addresses)) == 1


# --- errors during the stream ---


async def test_mid_stream_error_after_text_raises_without_retry(fake, make_client):
    fake.mid_stream_error("partial ", message="model crashed", code=500)
    seen = []
    with pytest.raises(LLMError, match="model crashed") as caught:
        async for event in make_client().stream(USER):
            seen.append(event)
    assert caught.value.status == 500 and caught.value.kind == "server"
    assert "".join(e.text for e in seen if isinstance(e, TextDelta)) == "partial "
    assert len(fake.requests) == 1


async def test_error_right_after_the_200_is_retried(fake, make_client, clock):
    fake.mid_stream_error("", message="slot unavailable", code=503)
    fake.reply("recovered")
    done = await make_client().complete(USER)
    assert done.text == "recovered" and len(fake.requests) == 2 and len(clock.sleeps) == 1


async def test_stream_ending_without_finish_is_interrupted(fake, make_client):
    fake.truncate("partial ")
    with pytest.raises(StreamInterrupted, match="ended before the answer was complete"):
        await events_of(make_client())
    assert len(fake.requests) == 1


# --- retries and fallback ---


@pytest.mark.parametrize("where", ["header", "body", "error"])
async def test_429_waits_at_least_retry_after(fake, make_client, clock, notices, where):
    fake.error(429, retry_after=2, retry_after_in=where)
    fake.reply("ok")
    done = await make_client().complete(USER)

    assert done.text == "ok" and len(fake.requests) == 2
    assert len(clock.sleeps) == 1 and 2.0 <= clock.sleeps[0] <= 2.2
    [notice] = notices
    assert (notice.attempt, notice.model, notice.next_model) == (1, "m1", "m1")
    assert isinstance(notice.error, RateLimited) and notice.error.retry_after == 2
    assert notice.delay_s == clock.sleeps[0]


async def test_429_beyond_the_retry_budget_gives_up_without_waiting(fake, make_client, clock):
    fake.error(429, retry_after=600)
    with pytest.raises(LLMUnavailable) as caught:
        await events_of(make_client(retry_budget_s=60))
    assert isinstance(caught.value.last_error, RateLimited)
    assert clock.sleeps == [] and len(fake.requests) == 1


async def test_retry_budget_bounds_the_total_wait(fake, make_client, clock):
    for _ in range(10):
        fake.error(429, retry_after=20)
    with pytest.raises(LLMUnavailable):
        await events_of(make_client(retry_budget_s=50, max_retries=10))
    assert sum(clock.sleeps) <= 50 and len(clock.sleeps) == 2


async def test_5xx_backs_off_exponentially_then_falls_back(fake, make_client, clock, notices):
    for _ in range(3):
        fake.error(500)
    fake.reply("from the fallback")
    events = await events_of(make_client(max_retries=2, fallback_models=["m2"]))

    assert [r["model"] for r in fake.requests] == ["m1", "m1", "m1", "m2"]
    assert events[0] == ModelInfo("m2", served="m2", attempts=4, fell_back_from=("m1",))
    assert BASE * 0.5 <= clock.sleeps[0] <= BASE and BASE <= clock.sleeps[1] <= 2 * BASE
    assert [(n.model, n.next_model) for n in notices] == [("m1", "m1"), ("m1", "m1"), ("m1", "m2")]


async def test_every_model_failing_raises_unavailable_with_the_models_tried(fake, make_client):
    for _ in range(4):
        fake.error(502)
    with pytest.raises(LLMUnavailable, match="m1, m2") as caught:
        await events_of(make_client(max_retries=1, fallback_models=["m2"]))
    assert caught.value.tried == ("m1", "m2") and caught.value.last_error.status == 502
    assert len(fake.requests) == 4


async def test_connection_errors_are_retried(make_client, clock):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(LLMUnavailable) as caught:
        await events_of(make_client(base_url=f"http://127.0.0.1:{port}/v1", max_retries=2))
    assert caught.value.last_error.kind == "connection" and len(clock.sleeps) == 2


async def test_async_retry_hook_is_awaited(fake, clock):
    seen: list[RetryNotice] = []

    async def record(notice: RetryNotice) -> None:
        await asyncio.sleep(0)
        seen.append(notice)

    fake.error(503)
    async with LLMClient(LLMConfig(base_url=fake.base_url), sleep=clock.sleep, backoff_base_s=BASE) as client:
        await client.complete(USER, on_retry=record)
    assert len(seen) == 1 and seen[0].error.status == 503


@pytest.mark.parametrize("status", [401, 403])
async def test_auth_errors_are_not_retried_and_name_the_setting(fake, make_client, clock, status):
    fake.error(status, message="invalid key")
    with pytest.raises(AuthError, match=r"check llm\.api_key") as caught:
        await events_of(make_client(fallback_models=["m2"]))
    assert caught.value.status == status and len(fake.requests) == 1 and clock.sleeps == []


async def test_wrong_api_key_against_a_checking_server(make_client):
    async with FakeLLM(api_key="right") as strict:
        with pytest.raises(AuthError, match="Incorrect API key.*llm.api_key"):
            await events_of(make_client(base_url=strict.base_url, api_key="wrong"))


async def test_rejected_conversation_is_a_clear_non_retried_error(fake, make_client):
    bad = [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "nope", "content": "x"}]
    with pytest.raises(LLMError, match="no preceding assistant tool call") as caught:
        await events_of(make_client(), messages=bad)
    assert caught.value.status == 400 and not caught.value.retryable and len(fake.requests) == 1


# --- context too long ---


@pytest.mark.parametrize(
    ("dialect", "mid_stream"), [("openai", False), ("llamacpp", False), ("vllm", False), ("llamacpp", True)]
)
async def test_context_too_long_carries_the_server_numbers(fake, make_client, dialect, mid_stream):
    fake.context_too_long(dialect, prompt_tokens=12345, n_ctx=8192, mid_stream=mid_stream)
    with pytest.raises(ContextTooLong) as caught:
        await events_of(make_client(fallback_models=["m2"]))
    assert (caught.value.prompt_tokens, caught.value.context_window) == (12345, 8192)
    assert len(fake.requests) == 1


def test_context_too_long_other_wordings():
    flat_vllm = {"object": "error", "code": 400, "type": "BadRequestError", "message": (
        "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens.")}
    error = classify_error(400, flat_vllm)
    assert isinstance(error, ContextTooLong) and (error.prompt_tokens, error.context_window) == (5000, 4096)
    vague = classify_error(400, {"error": {"message": "Input exceeds the context window"}})
    assert isinstance(vague, ContextTooLong) and (vague.prompt_tokens, vague.context_window) == (None, None)
    assert not isinstance(classify_error(400, {"error": {"message": "unknown field foo"}}), ContextTooLong)


def test_retry_after_forms():
    now = 1_700_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"retry-after": date}, None, now=now) == pytest.approx(30)
    assert parse_retry_after({"retry-after-ms": "1500"}, None) == 1.5
    assert parse_retry_after({"retry-after": "soon"}, {"retry_after": 4}) == 4
    assert parse_retry_after({}, {"error": {"retry_after": "7"}}) == 7
    assert parse_retry_after({}, "plain text") is None


# --- cancellation ---


async def test_cancelling_the_consumer_closes_the_request(fake, make_client):
    fake.stall("thinking")
    started = asyncio.Event()

    async def consume() -> None:
        async for event in make_client().stream(USER):
            if isinstance(event, TextDelta):
                started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 5)
    assert fake.disconnects == 0
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await fake.wait_disconnect()
    assert fake.disconnects == 1


async def test_closing_the_generator_closes_the_request(fake, make_client):
    fake.stall("thinking")
    stream = make_client().stream(USER)
    async for event in stream:
        if isinstance(event, TextDelta):
            break
    await stream.aclose()
    await fake.wait_disconnect()
    assert fake.disconnects == 1


async def test_complete_collects_text_usage_and_model(fake, make_client):
    fake.reply("A short summary.", model="served-name")
    done = await make_client().complete(USER, model="summariser", max_tokens=64)
    assert isinstance(done, Completion)
    assert (done.text, done.model, done.served, done.finish_reason) == (
        "A short summary.",
        "summariser",
        "served-name",
        "stop",
    )
    assert done.usage is not None and done.usage.completion_tokens > 0 and done.tool_calls == ()
    assert fake.requests[0]["model"] == "summariser" and fake.requests[0]["max_tokens"] == 64

