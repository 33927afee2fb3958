"""The client with `api: responses` against the strict, hostile Responses fake (real HTTP on
127.0.0.1): what it sends is accepted, what it is sent comes out as the turn loop's events,
and the fake refuses what OpenAI refuses."""

from __future__ import annotations

import json
import random

import httpx
import pytest
from fakes.llm import FakeLLM
from fakes.llm_responses import FakeResponses
from fakes.responses_rules import user_texts

from gateway.config import LLMConfig
from gateway.llm import Finish, LLMClient, ReasoningDelta, StreamInterrupted, TextDelta, Usage, collect
from gateway.llm.errors import ContextTooLong, LLMError
from gateway.llm.events import Replay
from gateway.llm.formats import REPLAY_KEY, Request
from gateway.llm.formats.responses import ResponsesFormat

TOOLS = [
    {
        "type": "function",
        "function": {"name": "clock", "description": "The time.", "parameters": {"type": "object", "properties": {}}},
    }
]
SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 300}  # long enough to be cached
USER = [SYSTEM, {"role": "user", "content": "What time is it?"}]


class FakeTime:
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
    async with FakeResponses(chunk_chars=5) as server:
        yield server


@pytest.fixture
def clock() -> FakeTime:
    return FakeTime()


@pytest.fixture
async def make_client(fake, clock):
    clients: list[LLMClient] = []

    def make(**settings) -> LLMClient:
        settings = {"model": "gpt-5-mini", "base_url": fake.base_url, "api": "responses", **settings}
        client = LLMClient(
            LLMConfig(**settings), backoff_base_s=0.01, sleep=clock.sleep, clock=clock.clock, rng=random.Random(3)
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


async def events_of(client: LLMClient, messages=USER, **kwargs) -> list:
    return [event async for event in client.stream(messages, TOOLS, **kwargs)]


def assistant_round(events: list, text: str = "") -> dict:
    """The assistant message the turn stores for a round, replay included (as the turn does)."""
    calls, replay = {}, None
    for event in events:
        if event.kind == "tool_call":
            call = calls.setdefault(event.index, {"id": "", "name": "", "arguments": ""})
            call["id"] = call["id"] or event.id
            call["name"] = call["name"] or event.name
            call["arguments"] += event.arguments
        elif isinstance(event, Replay):
            replay = {"api": event.api, "data": json.loads(json.dumps(event.data))}  # through the database's JSON
    message = {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()
        ],
    }
    if replay is not None:
        message[REPLAY_KEY] = replay
    return message


def results(message: dict, output: str = "12:00") -> list[dict]:
    return [{"role": "tool", "tool_call_id": c["id"], "content": output} for c in message["tool_calls"]]


# ---- streaming ------------------------------------------------------------------------------


async def test_a_text_reply_streams_as_text_finish_and_usage(fake, make_client):
    fake.reply("It is noon, as far as I know.", model="gpt-5-mini-2025-08-07")
    events = await events_of(make_client(api_key="sk-1"))
    assert events[0].model == "gpt-5-mini" and events[0].served == "gpt-5-mini-2025-08-07"
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "It is noon, as far as I know."
    assert [type(e) for e in events[-2:]] == [Finish, Usage] and events[-2].reason == "stop"
    request = fake.requests[0]
    assert request["model"] == "gpt-5-mini" and request["store"] is False
    assert user_texts(request) == ["What time is it?"]
    assert fake.headers[0]["Authorization"] == "Bearer sk-1"
    assert fake.rejections == []


async def test_a_reasoning_turn_of_two_tool_rounds_carries_its_reasoning_items(fake, make_client):
    fake.tool_call("clock", {}, id="call_a", reasoning="I should look at the clock.")
    fake.tool_call("clock", {"tz": "UTC"}, id="call_b", reasoning="And once more in UTC.")
    fake.reply("Noon, both times.", reasoning="Both agree.")
    client = make_client(reasoning="medium")

    first = await events_of(client)
    assert "".join(e.text for e in first if isinstance(e, ReasoningDelta)).startswith("I should look at the clock.")
    one = assistant_round(first)
    history = [*USER, one, *results(one)]
    second = await events_of(client, history)
    two = assistant_round(second)
    history += [two, *results(two)]
    done = await collect(client.stream(history, TOOLS))

    assert done.text == "Noon, both times."
    assert fake.rejections == [] and fake.accepted == 3
    sent = fake.requests[2]["input"]
    reasoning = [item for item in sent if item["type"] == "reasoning"]
    assert [item["id"] for item in reasoning] == list(fake.issued)[:2]
    assert all(item == fake.issued[item["id"]] for item in reasoning)  # unchanged
    assert fake.requests[0]["reasoning"] == {"effort": "medium"}
    assert fake.requests[0]["include"] == ["reasoning.encrypted_content"]


async def test_the_fake_refuses_a_round_whose_reasoning_was_dropped_or_altered(fake, make_client):
    fake.tool_call("clock", {}, id="call_a", reasoning="Look at the clock.")
    client = make_client(reasoning="low")
    one = assistant_round(await events_of(client))
    dropped = {k: v for k, v in one.items() if k != REPLAY_KEY}
    with pytest.raises(LLMError, match="without its required 'reasoning' item"):
        await events_of(client, [*USER, dropped, *results(one)])
    altered = json.loads(json.dumps(one))
    altered[REPLAY_KEY]["data"][0]["summary"][0]["text"] = "Something else."
    with pytest.raises(LLMError, match="altered"):
        await events_of(client, [*USER, altered, *results(one)])
    forged = json.loads(json.dumps(one))
    forged[REPLAY_KEY]["data"][0]["encrypted_content"] = "enc_forged"
    with pytest.raises(LLMError, match="could not be verified"):
        await events_of(client, [*USER, forged, *results(one)])


async def test_the_session_is_the_prompt_cache_key_and_the_cached_prefix_is_counted(fake, make_client):
    client = make_client(prompt_cache_key=True)
    fake.reply("one")
    fake.reply("two")
    first = await events_of(client, cache_key="session-1")
    second = await events_of(
        client,
        [*USER, {"role": "assistant", "content": "one"}, {"role": "user", "content": "and?"}],
        cache_key="session-1",
    )
    assert [r["prompt_cache_key"] for r in fake.requests] == ["session-1", "session-1"]
    assert first[-1].cached_tokens == 0 and first[-1].cache_write_tokens >= 1024  # the prefix written
    usage = second[-1]
    assert isinstance(usage, Usage) and 1024 <= usage.cached_tokens < usage.prompt_tokens
    written = first[-1].cache_write_tokens
    assert written - 128 <= usage.cached_tokens <= written  # read back (to the step the prefix reaches)


async def test_the_cache_key_goes_only_where_the_setting_allows(fake, make_client):
    fake.reply("ok")
    await events_of(make_client(), cache_key="session-1")  # not api.openai.com, not configured
    assert "prompt_cache_key" not in fake.requests[0]


async def test_max_output_tokens_cuts_the_reply_and_finishes_by_length(fake, make_client):
    fake.reply("x" * 200)
    fake.reply("y" * 200)
    events = await events_of(make_client(max_tokens=20))
    assert fake.requests[0]["max_output_tokens"] == 20
    assert [e.reason for e in events if isinstance(e, Finish)] == ["length"]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == "x" * 80  # the fake: 4 characters a token
    await events_of(make_client(max_tokens=3))  # what a spend cap leaves may be less than OpenAI takes
    assert fake.requests[1]["max_output_tokens"] == 16 and fake.rejections == []


# ---- failures -------------------------------------------------------------------------------


async def test_a_429_waits_for_retry_after_then_succeeds(fake, make_client, clock):
    fake.error(429, retry_after=3)
    fake.reply("ok")
    done = await make_client().complete(USER)
    assert done.text == "ok" and len(fake.requests) == 2
    assert len(clock.sleeps) == 1 and 3.0 <= clock.sleeps[0] <= 3.3


async def test_an_error_event_after_the_200_is_retried_by_its_code(fake, make_client, clock):
    fake.mid_stream_error("", message="Rate limit reached", code=429)
    fake.reply("ok")
    done = await make_client().complete(USER)
    assert done.text == "ok" and len(fake.requests) == 2


async def test_an_error_event_after_text_is_not_retried(fake, make_client):
    fake.mid_stream_error("partial answer ", message="The server had an error", code=500)
    with pytest.raises(LLMError) as caught:
        await events_of(make_client())
    assert caught.value.kind == "server" and len(fake.requests) == 1


async def test_a_stream_cut_after_text_is_interrupted(fake, make_client):
    fake.truncate("half an ans")
    with pytest.raises(StreamInterrupted):
        await events_of(make_client())
    assert len(fake.requests) == 1


async def test_a_stream_cut_before_any_text_is_retried(fake, make_client):
    fake.truncate("")
    fake.reply("whole")
    assert (await make_client().complete(USER)).text == "whole"


async def test_server_errors_through_every_retry_fall_back_to_a_chat_model_on_another_server(fake, make_client):
    async with FakeLLM() as chat:
        chat.reply("from chat completions")
        for _ in range(3):
            fake.error(500)
        models = {"local": {"model": "qwen", "base_url": chat.base_url, "api": "chat"}}
        done = await make_client(max_retries=2, models=models, fallback=["local"]).complete(USER)
    assert done.text == "from chat completions" and done.model == "local"
    assert len(fake.requests) == 3 and chat.requests[0]["messages"][0]["role"] == "system"


async def test_a_refused_key_is_an_auth_error(fake, make_client):
    fake.api_key = "sk-right"
    with pytest.raises(LLMError) as caught:
        await events_of(make_client(api_key="sk-wrong"))
    assert caught.value.kind == "auth" and not caught.value.retryable


async def test_rate_limit_code_in_a_failed_response(fake, make_client, clock):
    failed = {
        "type": "response.failed",
        "response": {"status": "failed", "error": {"code": "rate_limit_exceeded", "message": "slow down"}},
    }
    fake.raw("event: response.failed", f"data: {json.dumps(failed)}", "")
    fake.reply("ok")
    assert (await make_client().complete(USER)).text == "ok"
    assert len(clock.sleeps) == 1


# ---- the fake is as strict as the API --------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        (
            lambda b: b["input"].insert(1, {"type": "function_call_output", "call_id": "nope", "output": "x"}),
            "No tool call found for function call output with call_id nope",
        ),
        (
            lambda b: b["input"].append({"type": "function_call", "call_id": "c", "name": "clock", "arguments": "{}"}),
            "No tool output found for function call c",
        ),
        (
            lambda b: b["input"].append({"type": "computer_call_output", "call_id": "c"}),
            "Invalid value: 'computer_call_output'",
        ),
        (lambda b: b.update(tools=TOOLS), "Unknown parameter: 'tools[0].function'"),
        (lambda b: b.update(messages=[]), "Unknown parameter: 'messages'"),
        (lambda b: b.update(store=True), "store"),
        (lambda b: b.update(max_output_tokens=8), "Invalid 'max_output_tokens': integer below minimum value"),
        (
            lambda b: b["input"].insert(
                0, {"type": "reasoning", "id": "rs_x", "summary": [], "encrypted_content": "e"}
            ),
            "Item with id 'rs_x' not found",
        ),
        (
            lambda b: b["input"][0]["content"].append({"type": "image_url", "image_url": {"url": "x"}}),
            "Invalid value: 'image_url'",
        ),
    ],
)
async def test_the_fake_refuses_what_the_api_refuses(fake, change, refusal):
    body = {"model": "m", **ResponsesFormat.body(Request(USER, TOOLS))}
    assert (await _post(fake, body)).status_code == 200
    change(body)
    answer = await _post(fake, body)
    assert answer.status_code == 400
    assert refusal in answer.json()["error"]["message"]


async def _post(fake: FakeResponses, body: dict) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        response = await client.post(fake.base_url + "/responses", json=body)
        await response.aread()
        return response


async def test_events_come_in_the_documented_order_with_usage_only_at_the_end(fake):
    fake.tool_call("clock", {"tz": "UTC"}, text="Let me look.", reasoning="Think.")
    body = {"model": "m", **ResponsesFormat.body(Request(USER, TOOLS, reasoning="low"))}
    answer = await _post(fake, body)
    events = [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert all(e["response"]["usage"] is None for e in events[:-1] if "response" in e)
    assert events[-1]["response"]["usage"]["output_tokens_details"]["reasoning_tokens"] >= 1
    items = [e["item"]["type"] for e in events if e["type"] == "response.output_item.done"]
    assert items == ["reasoning", "message", "function_call"]


async def test_the_fake_refuses_reasoning_without_the_item_that_followed_it(fake, make_client):
    fake.tool_call("clock", {}, id="call_a", reasoning="Look at the clock.")
    one = assistant_round(await events_of(make_client(reasoning="low")))
    [item] = one[REPLAY_KEY]["data"]
    body = {"model": "m", **ResponsesFormat.body(Request(USER, TOOLS, reasoning="low"))}
    body["input"].append(item)  # last, with nothing after it
    answer = await _post(fake, body)
    assert answer.status_code == 400
    assert "of type 'reasoning' was provided without its required following item" in answer.json()["error"]["message"]


async def test_an_error_event_with_an_error_object_is_read_by_its_code(fake, make_client):
    error = {
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
        "message": "Your input exceeds the context window of this model. Please adjust your input and try again.",
    }
    fake.raw("event: error", f"data: {json.dumps({'type': 'error', 'sequence_number': 2, 'error': error})}", "")
    with pytest.raises(ContextTooLong):
        await events_of(make_client())
    assert len(fake.requests) == 1  # a prompt over the context is not retried
