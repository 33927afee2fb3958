"""The error shapes of real OpenAI-compatible servers, and how the client classifies them."""

from __future__ import annotations

import random

import pytest
from fakes.llm import FakeLLM

from gateway.config import LLMConfig
from gateway.llm import LLMClient, LLMError, Refused, StreamInterrupted, TextDelta

USER = [{"role": "user", "content": "hi"}]


async def no_wait(seconds: float) -> None:
    return None


@pytest.fixture
async def fake():
    async with FakeLLM(chunk_chars=4) as llm:
        yield llm


@pytest.fixture
async def client(fake):
    client = LLMClient(LLMConfig(base_url=fake.base_url, model="m"), sleep=no_wait, rng=random.Random(1))
    yield client
    await client.aclose()


async def test_an_empty_stream_twice_for_the_same_body_is_a_refusal_not_five_retries(fake, client):
    fake.empty_stream()
    fake.empty_stream()
    fake.reply("never asked for")
    with pytest.raises(Refused, match="empty stream") as caught:
        await client.complete(USER)
    assert not caught.value.retryable and len(fake.requests) == 2 and fake.pending == 1


async def test_one_empty_stream_is_retried(fake, client):
    fake.empty_stream()
    fake.reply("there")
    assert (await client.complete(USER)).text == "there" and len(fake.requests) == 2


async def test_a_template_refusal_by_empty_stream_is_a_refusal(client):
    async with FakeLLM(template_errors="empty_stream") as strict:
        llm = LLMClient(LLMConfig(base_url=strict.base_url, model="m"), sleep=no_wait)
        with pytest.raises(Refused):
            await llm.complete([*USER, *USER])
        await llm.aclose()
    assert len(strict.requests) == 2 and "alternate" in strict.rejections[0]


async def test_a_500_with_a_validation_dump_is_not_retried(fake, client):
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
    ]
    with pytest.raises(LLMError, match="refused the request as invalid") as caught:
        await client.complete(messages)
    assert caught.value.status == 500 and not caught.value.retryable and "llm.tool_call_content" in str(caught.value)
    assert len(fake.requests) == 1


async def test_a_plain_500_is_still_retried(fake, client):
    fake.error(500, message="upstream hiccup")
    fake.reply("fine")
    assert (await client.complete(USER)).text == "fine" and len(fake.requests) == 2


async def test_pings_between_chunks_are_ignored(fake, client):
    fake.raw(
        ": ping",
        "",
        'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}',
        "",
        ": ping",
        "",
        'data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}',
        "",
        "data: [DONE]",
        "",
    )
    assert (await client.complete(USER)).text == "ab"


async def test_a_stream_cut_after_text_is_not_retried(fake, client):
    fake.truncate("half an ans")
    seen = []
    with pytest.raises(StreamInterrupted):
        async for event in client.stream(USER):
            seen.append(event)
    assert "".join(e.text for e in seen if isinstance(e, TextDelta)) == "half an ans" and len(fake.requests) == 1
