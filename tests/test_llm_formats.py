"""The seam between the client and the wire formats: which adapter a model gets, what the Chat
Completions adapter adds for reasoning and the prompt cache key, and that another API's replay
never reaches a server that does not speak it."""

from __future__ import annotations

import pytest
from fakes.llm import FakeLLM

from gateway.config import LLMConfig
from gateway.llm import LLMClient
from gateway.llm.formats import REPLAY_KEY, Request, format_for
from gateway.llm.formats.chat import ChatFormat


def test_a_named_model_speaks_its_own_api_else_llms_on_llms_server_else_chat() -> None:
    config = LLMConfig(
        base_url="http://a/v1",
        api="anthropic",
        models={
            "same": {"model": "m"},
            "other": {"model": "m", "base_url": "http://b/v1"},
            "told": {"model": "m", "base_url": "http://b/v1", "api": "responses"},
        },
    )
    assert [config.api_of(name) for name in ("test", "same", "other", "told")] == [
        "anthropic",
        "anthropic",
        "chat",
        "responses",
    ]


def test_an_api_without_an_adapter_is_named_with_the_ones_there_are() -> None:
    with pytest.raises(ValueError, match="chat"):
        format_for("smoke-signals")


@pytest.mark.parametrize(("level", "effort"), [("auto", None), ("off", "minimal"), ("high", "high")])
def test_chat_sends_reasoning_effort_by_level(level, effort) -> None:
    body = ChatFormat.body(Request([{"role": "user", "content": "hi"}], reasoning=level))
    assert body.get("reasoning_effort") == effort


async def test_the_session_goes_as_prompt_cache_key_only_where_the_model_takes_it() -> None:
    async with FakeLLM() as fake:
        config = LLMConfig(
            base_url=fake.base_url, model="m", models={"keyed": {"model": "k", "prompt_cache_key": True}}
        )
        async with LLMClient(config) as llm:
            await llm.complete([{"role": "user", "content": "hi"}])
            async for _ in llm.stream([{"role": "user", "content": "hi"}], cache_key="session-7"):
                pass
            async for _ in llm.stream([{"role": "user", "content": "hi"}], model="keyed", cache_key="session-7"):
                pass
    assert [r.get("prompt_cache_key") for r in fake.requests] == [None, None, "session-7"]


async def test_another_apis_replay_is_left_out_of_a_chat_request_and_the_history_is_not_changed() -> None:
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}],
        REPLAY_KEY: {"api": "anthropic", "data": [{"type": "thinking", "thinking": "t", "signature": "s"}]},
    }
    history = [{"role": "user", "content": "time?"}, message, {"role": "tool", "tool_call_id": "c1", "content": "noon"}]
    async with FakeLLM() as fake, LLMClient(LLMConfig(base_url=fake.base_url, model="m")) as llm:
        await llm.complete(history)
    assert all(REPLAY_KEY not in m for m in fake.requests[0]["messages"]) and not fake.rejections
    assert REPLAY_KEY in message  # the turn's own copy keeps it for the rounds to come


def test_a_replay_counts_in_the_context_it_is_sent_with() -> None:
    """The thinking a turn's next rounds read again is part of their prompt: the window's budget
    counts it."""
    from gateway.context.budget import message_chars

    plain = {"role": "assistant", "content": "", "tool_calls": []}
    thought = "a long thought " * 100
    carried = {**plain, REPLAY_KEY: {"api": "anthropic", "data": [{"type": "thinking", "thinking": thought}]}}
    assert message_chars(carried) - message_chars(plain) > len(thought)
