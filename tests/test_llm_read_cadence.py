"""Many streams in flight are read at a cadence, several chunks a read; the events are the same.
(The CPU this saves is measured by bench/gateway_load.py, not here.)"""

from __future__ import annotations

import asyncio

import pytest
from fakes.llm import FakeLLM, FakeToolCall

from gateway.config import LLMConfig
from gateway.llm import LLMClient, ReadCadence
from gateway.llm.stream import collect

USER = [{"role": "user", "content": "hi"}]
TEXT = "The cadence changes when a stream is read, never what it says. " * 2
CALLS = (FakeToolCall("clock", {"timezone": "UTC"}, "call_1"), FakeToolCall("echo", {"text": "x" * 40}, "call_2"))


@pytest.fixture
async def slow_llm():
    async with FakeLLM(chunk_chars=4, delay=0.005, pings=False) as llm:  # ~60 chunks over ~0.3 s
        yield llm


async def answer(llm: FakeLLM, cadence: ReadCadence):
    llm.tool_calls(*CALLS, text=TEXT)
    async with LLMClient(LLMConfig(base_url=llm.base_url, model="m1"), cadence=cadence) as client:
        completion = await collect(client.stream(USER))
        return completion, client.pauses


async def test_a_spaced_stream_says_the_same(slow_llm):
    eager, eager_pauses = await answer(slow_llm, ReadCadence(from_streams=1))  # one stream: read as it comes
    spaced, spaced_pauses = await answer(slow_llm, ReadCadence(from_streams=0, per_stream_s=0.05, max_s=0.05))

    assert spaced.text == eager.text == TEXT
    assert spaced.tool_calls == eager.tool_calls and [c.name for c in spaced.tool_calls] == ["clock", "echo"]
    assert (spaced.finish_reason, spaced.usage) == (eager.finish_reason, eager.usage)
    assert eager_pauses == 0
    assert spaced_pauses >= 2  # a ~0.3 s stream, paused for 50 ms after each read that waited


async def test_reads_are_spaced_only_beyond_the_threshold():
    cadence = ReadCadence(from_streams=50, per_stream_s=0.001, max_s=0.25)
    assert cadence.interval(1) == cadence.interval(50) == 0.0
    assert cadence.interval(150) == pytest.approx(0.1)
    assert cadence.interval(5000) == 0.25


async def test_the_streams_in_flight_are_counted_until_each_ends(slow_llm):
    slow_llm.reply(TEXT)
    slow_llm.reply(TEXT)
    async with LLMClient(LLMConfig(base_url=slow_llm.base_url, model="m1")) as client:
        first, second = client.stream(USER), client.stream(USER)
        await anext(first), await anext(second)
        assert client.streams_in_flight == 2
        await collect(first)
        assert client.streams_in_flight == 1
        await second.aclose()  # a consumer that stops early
        assert client.streams_in_flight == 0
    await asyncio.sleep(0)
