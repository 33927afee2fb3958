"""The client in `api: anthropic` against the strict and hostile Messages fake (tests/fakes/anthropic.py):
the request it builds, the stream it decodes, the errors it retries and the ones it does not."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fakes.anthropic import FakeAnthropic, thinking_blocks, user_texts
from fakes.anthropic_rules import signature
from fakes.llm import FakeLLM, FakeToolCall

from gateway.config import LLMConfig
from gateway.llm import (
    AuthError,
    ContextTooLong,
    LLMClient,
    LLMError,
    Replay,
    StreamInterrupted,
    ToolCallDelta,
    Usage,
)
from gateway.llm.formats import REPLAY_KEY

CLOCK = {
    "type": "function",
    "function": {"name": "clock", "description": "The time.", "parameters": {"type": "object"}},
}
EPHEMERAL = {"type": "ephemeral"}
READ = {"type": "function", "function": {"name": "read", "description": "A file.", "parameters": {"type": "object"}}}


async def waits(_: float) -> None:
    return None


def client(fake: FakeAnthropic, **llm: Any) -> LLMClient:
    config = LLMConfig(base_url=fake.base_url, api="anthropic", api_key="sk-test", model="claude-test", **llm)
    return LLMClient(config, sleep=waits, backoff_base_s=0.0)


@pytest.fixture
async def fake():
    async with FakeAnthropic(api_key="sk-test") as server:
        yield server


def assistant(text: str, *calls: tuple[str, str, str], replay: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls
        ]
    if replay is not None:
        message[REPLAY_KEY] = {"api": "anthropic", "data": replay}
    return message


async def test_a_reply_streams_with_the_system_on_top_and_the_headers_the_api_wants(fake) -> None:
    fake.reply("Hello there", usage=None)
    async with client(fake) as llm:
        done = await llm.complete([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    assert done.text == "Hello there" and done.finish_reason == "stop" and done.served == "claude-test"
    (body,) = fake.requests
    assert body["system"] == [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert body["max_tokens"] == 8192 and body["stream"] is True and "thinking" not in body
    headers = fake.headers[0]
    assert headers["anthropic-version"] == "2023-06-01" and headers["x-api-key"] == "sk-test"
    assert "Authorization" not in headers


async def test_tool_calls_and_results_become_paired_blocks_in_alternating_messages(fake) -> None:
    fake.tool_calls(FakeToolCall("clock", {}, "toolu_3"), FakeToolCall("read", {"path": "a"}, "toolu_4"))
    history = [
        {"role": "user", "content": "first"},
        {"role": "user", "content": "and more"},  # two user messages in a row: one message
        assistant("", ("toolu_1", "clock", "{}"), ("toolu_2", "read", '{"path": "x"}')),
        {"role": "tool", "tool_call_id": "toolu_1", "content": "noon"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": ""},
        {"role": "user", "content": "[context] now"},  # the gateway's note after the results
    ]
    async with client(fake) as llm:
        done = await llm.complete(history, tools=[CLOCK, READ])
    assert [(c.id, c.name, json.loads(c.arguments)) for c in done.tool_calls] == [
        ("toolu_3", "clock", {}),
        ("toolu_4", "read", {"path": "a"}),
    ]
    assert done.finish_reason == "tool_calls"
    (body,) = fake.requests
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "user"]
    use = body["messages"][1]["content"][1]
    assert use == {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {"path": "x"}}
    results = body["messages"][2]["content"]
    assert [b["type"] for b in results] == ["tool_result", "tool_result", "text"]
    # an empty result, no empty text; the last result is where the next request goes on
    assert results[1] == {"type": "tool_result", "tool_use_id": "toolu_2", "cache_control": EPHEMERAL}
    assert body["tools"][0] == {"name": "clock", "input_schema": {"type": "object"}, "description": "The time."}


async def test_cache_breakpoints_sit_on_the_system_and_the_stable_history(fake) -> None:
    fake.reply("fine")
    fake.reply("fine")
    history = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "old question"},
        {"role": "assistant", "content": "old answer"},
        {"role": "user", "content": "new question"},
        assistant("", ("toolu_1", "clock", "{}")),
        {"role": "tool", "tool_call_id": "toolu_1", "content": "noon"},
        {"role": "user", "content": "[context] the tail"},
    ]
    async with client(fake) as llm:
        await llm.complete(history, tools=[CLOCK, READ])
        await llm.complete(history[1:], tools=[CLOCK, READ])
    with_system, without = fake.requests
    assert not any("cache_control" in t for t in with_system["tools"])  # the system's prefix holds them
    assert "cache_control" in with_system["system"][-1]
    marks = [(i, b["type"]) for i, b in marked_blocks(with_system)]
    # the old answer (the history before the newest words and what the request before sent,
    # which had the tail joined to the new question) and the newest result, not the tail after it
    assert marks == [(1, "text"), (4, "tool_result")]
    assert with_system["messages"][1]["content"][-1]["text"] == "old answer"
    assert [t["name"] for t in without["tools"] if "cache_control" in t] == ["read"]  # no system: the last tool


async def test_each_request_of_a_conversation_reads_all_the_one_before_sent_but_its_tail(fake) -> None:
    """Two tool rounds, a turn without tools and the turn after it, each request with the tail
    (the clock) at its end, as the gateway sends them: each reads from the cache the prefix the
    request before wrote, up to where the tail began, a longer one each time."""
    for _ in range(2):
        fake.tool_call("read", {"path": "a"})
    for _ in range(3):
        fake.reply("Done.")
    system = {"role": "system", "content": "You are the team's assistant. " * 200}
    result = "log line " * 300
    history: list[dict[str, Any]] = [system, {"role": "user", "content": "first question"}]
    tails = iter(f"[context] It is 10:0{n}." for n in range(9))

    def request() -> list[dict[str, Any]]:
        last = history[-1]
        if last["role"] == "user":  # the tail joins the newest words, as the gateway sends it
            return [*history[:-1], {"role": "user", "content": f"{last['content']}\n\n{next(tails)}"}]
        return [*history, {"role": "user", "content": next(tails)}]

    async with client(fake) as llm:
        for n in range(5):
            done = await llm.complete(request(), tools=[CLOCK, READ])
            calls = [(c.id, c.name, c.arguments) for c in done.tool_calls]
            history.append(assistant(done.text, *calls))
            history += [{"role": "tool", "tool_call_id": c[0], "content": f"{result} {n}"} for c in calls]
            if not calls:
                history.append({"role": "user", "content": f"question {n}"})
    assert fake.accepted == 5
    assert fake.cache_reads[0] == 0
    assert all(a < b for a, b in zip(fake.cache_reads, fake.cache_reads[1:], strict=False)), fake.cache_reads
    assert all(len(marked_blocks(r)) <= 3 for r in fake.requests)  # with the system's: the API's four


def marked_blocks(body: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    """(message index, block) of each message block with a cache breakpoint."""
    return [(i, b) for i, m in enumerate(body["messages"]) for b in m["content"] if "cache_control" in b]


async def test_thinking_goes_back_unchanged_through_two_tool_rounds_and_every_request_is_accepted(fake) -> None:
    fake.tool_call("clock", {}, id="toolu_1", reasoning="I should look at the clock.", reasoning_field="redacted")
    fake.tool_call("read", {"path": "a"}, id="toolu_2", reasoning="Now the file.")
    fake.reply("Done.", reasoning="All known.")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "what time is it, and what is in a?"}]
    async with client(fake, reasoning="low", temperature=0.3) as llm:
        for _ in range(3):
            events = [e async for e in llm.stream(messages, [CLOCK, READ])]
            replay = next((e for e in events if isinstance(e, Replay)), None)
            calls = [e for e in events if isinstance(e, ToolCallDelta) and e.id]
            if not calls:
                break
            messages.append(assistant("", (calls[0].id, calls[0].name, "{}"), replay=replay.data if replay else None))
            messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "result"})
    assert fake.accepted == 3 and not fake.rejections
    first, second, third = fake.requests
    assert first["thinking"] == {"type": "enabled", "budget_tokens": 2048} and first["max_tokens"] == 2048 + 8192
    assert "temperature" not in first  # the API takes none with thinking
    assert [b["type"] for b in thinking_blocks(second)] == ["thinking", "redacted_thinking"]
    assert thinking_blocks(third)[:2] == thinking_blocks(second)  # unchanged, signatures and all
    assert [b["thinking"] for b in thinking_blocks(third) if b["type"] == "thinking"] == [
        "I should look at the clock.",
        "Now the file.",
    ]


async def test_a_changed_or_dropped_signature_is_refused_and_not_retried(fake) -> None:
    fake.tool_call("clock", {}, id="toolu_1", reasoning="Check the clock.")
    async with client(fake, reasoning="medium") as llm:
        events = [e async for e in llm.stream([{"role": "user", "content": "time?"}], [CLOCK])]
        (replay,) = [e for e in events if isinstance(e, Replay)]
        forged = [{**replay.data[0], "thinking": "Something else."}]
        for data in (forged, [{**replay.data[0], "signature": ""}]):
            history = [
                {"role": "user", "content": "time?"},
                assistant("", ("toolu_1", "clock", "{}"), replay=data),
                {"role": "tool", "tool_call_id": "toolu_1", "content": "noon"},
            ]
            with pytest.raises(LLMError) as refused:
                await llm.complete(history, tools=[CLOCK])
            assert refused.value.status == 400 and not refused.value.retryable
            assert "signature" in refused.value.message
    assert len(fake.requests) == 3


async def test_a_tool_round_without_its_thinking_goes_without_thinking(fake) -> None:
    """A fallback model answered the last round: it has no thinking to send back, so the request
    turns thinking off instead of being refused."""
    fake.reply("noon")
    history = [
        {"role": "user", "content": "time?"},
        assistant("", ("toolu_1", "clock", "{}")),
        {"role": "tool", "tool_call_id": "toolu_1", "content": "noon"},
    ]
    async with client(fake, reasoning="high") as llm:
        assert (await llm.complete(history, tools=[CLOCK])).text == "noon"
    assert "thinking" not in fake.requests[0] and not fake.rejections


async def test_overloaded_and_rate_limited_answers_are_retried_after_retry_after(fake) -> None:
    fake.overloaded()
    fake.error(429, retry_after=7)
    fake.reply("at last")
    waited: list[float] = []

    async def sleep(seconds: float) -> None:
        waited.append(seconds)

    config = LLMConfig(base_url=fake.base_url, api="anthropic", api_key="sk-test", model="m", retry_budget_s=60)
    async with LLMClient(config, sleep=sleep, backoff_base_s=0.01) as llm:
        assert (await llm.complete([{"role": "user", "content": "hi"}])).text == "at last"
    assert len(waited) == 2 and waited[0] < 1 and 7 <= waited[1] <= 7.7


@pytest.mark.parametrize(
    ("status", "kind", "error", "says"),
    [
        (401, "auth", AuthError, "llm.api_key"),
        (400, "bad_request", LLMError, "rejected the request"),
    ],
)
async def test_a_refused_key_or_request_is_one_line_and_not_retried(fake, status, kind, error, says) -> None:
    fake.error(status, message="nope")
    async with client(fake) as llm:
        with pytest.raises(error) as raised:
            await llm.complete([{"role": "user", "content": "hi"}])
    assert raised.value.kind == kind and says in raised.value.message and "\n" not in raised.value.message
    assert len(fake.requests) == 1


async def test_a_prompt_over_the_window_is_told_with_its_numbers(fake) -> None:
    fake.error(400, message="prompt is too long: 210000 tokens > 200000 maximum")
    async with client(fake) as llm:
        with pytest.raises(ContextTooLong) as raised:
            await llm.complete([{"role": "user", "content": "hi"}])
    assert (raised.value.prompt_tokens, raised.value.context_window) == (210000, 200000)


async def test_a_missing_key_is_refused_by_the_server_as_authentication(fake) -> None:
    config = LLMConfig(base_url=fake.base_url, api="anthropic", model="m")
    async with LLMClient(config, sleep=waits) as llm:
        with pytest.raises(AuthError):
            await llm.complete([{"role": "user", "content": "hi"}])
    assert fake.rejections == ["invalid x-api-key"]


async def test_a_stream_cut_mid_block_before_anything_was_yielded_is_retried(fake) -> None:
    fake.truncate("")  # message_start and ping, then the end
    fake.reply("whole")
    async with client(fake) as llm:
        assert (await llm.complete([{"role": "user", "content": "hi"}])).text == "whole"
    assert len(fake.requests) == 2


async def test_a_stream_cut_mid_block_after_text_is_an_interrupted_stream(fake) -> None:
    fake.truncate("half an ans")
    async with client(fake, max_retries=0) as llm:
        with pytest.raises(StreamInterrupted):
            await llm.complete([{"role": "user", "content": "hi"}])


async def test_an_error_event_mid_stream_before_text_is_retried(fake) -> None:
    fake.mid_stream_error("", message="Overloaded")
    fake.reply("ok now")
    async with client(fake) as llm:
        assert (await llm.complete([{"role": "user", "content": "hi"}])).text == "ok now"


@pytest.mark.parametrize("at_start", [True, False])
async def test_usage_counts_the_cache_reads_and_writes_whether_at_the_start_or_only_at_the_end(at_start) -> None:
    async with FakeAnthropic(usage_at_start=at_start) as fake:
        long_system = {"role": "system", "content": "rules " * 2000}
        history = [long_system, {"role": "user", "content": "one"}]
        async with client(fake) as llm:
            first = await llm.complete(history)
            history += [{"role": "assistant", "content": "two"}, {"role": "user", "content": "three"}]
            second = await llm.complete(history)
    assert isinstance(first.usage, Usage) and isinstance(second.usage, Usage)
    assert first.usage.cache_write_tokens > 1024 and first.usage.cached_tokens == 0
    assert second.usage.cached_tokens >= first.usage.cache_write_tokens
    assert second.usage.prompt_tokens > second.usage.cached_tokens + second.usage.cache_write_tokens
    assert second.usage.completion_tokens > 0


async def test_images_go_as_image_blocks(fake) -> None:
    fake.reply("a cat")
    parts = [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://example.org/cat.jpg"}},
    ]
    async with client(fake) as llm:
        await llm.complete([{"role": "user", "content": parts}])
    blocks = fake.requests[0]["messages"][0]["content"]
    assert blocks[1] == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    assert blocks[2] == {"type": "image", "source": {"type": "url", "url": "https://example.org/cat.jpg"}}


async def test_a_fallback_goes_to_a_model_on_another_api_within_one_call(fake) -> None:
    fake.overloaded()
    async with FakeLLM() as chat:
        chat.reply("from the chat server")
        config = LLMConfig(
            base_url=fake.base_url,
            api="anthropic",
            api_key="sk-test",
            model="claude-test",
            max_retries=0,
            models={"local": {"model": "qwen", "base_url": chat.base_url, "api": "chat"}},
            fallback=["local"],
        )
        history = [
            {"role": "user", "content": "time?"},
            assistant(
                "",
                ("toolu_1", "clock", "{}"),
                replay=[{"type": "thinking", "thinking": "t", "signature": signature("t")}],
            ),
            {"role": "tool", "tool_call_id": "toolu_1", "content": "noon"},
        ]
        async with LLMClient(config, sleep=waits) as llm:
            done = await llm.complete(history, tools=[CLOCK])
        assert done.text == "from the chat server" and done.model == "local"
        sent = chat.requests[0]
        assert sent["model"] == "qwen" and all(REPLAY_KEY not in m for m in sent["messages"])
        assert sent["tools"] == [CLOCK]


async def test_user_words_read_from_a_request(fake) -> None:
    fake.reply("ok")
    async with client(fake) as llm:
        await llm.complete([{"role": "user", "content": "hello"}])
    assert user_texts(fake.requests[0]) == ["hello"]
