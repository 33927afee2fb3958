"""Turns against servers that refuse, break off, or send no usage: each ends clearly, loses nothing."""

from __future__ import annotations

from fakes.llm import FakeLLM, user_texts
from harness import make_config, running_gateway
from helpers import every_api

from gateway.agent.refusals import CUT_OFF
from gateway.inbox.commands import cost_text


@every_api
async def test_an_empty_answer_twice_far_from_the_window_ends_the_turn_saying_so(store, llm, tmp_path):
    llm.empty_stream()
    llm.empty_stream()
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path), llm=llm.settings)) as h:
        await h.say("hello")
        await h.idle()
        said = h.channel.messages()[-1]
        assert "refused this conversation" in said and "empty stream" in said
        llm.reply("back again")
        await h.say("hello again")
        await h.idle()
        assert h.channel.messages()[-1] == "back again"
    assert len(llm.requests) == 3
    assert ("FAILED", "refused") in [(r.stage, r.end_reason) for r in await store.runs.list()]


async def test_an_over_long_message_is_set_aside_and_the_next_turn_works(store, tmp_path):
    async with FakeLLM(context_window=2_000, template_errors="empty_stream") as llm:
        for _ in range(4):  # llama.cpp refuses an over-long prompt with an empty stream
            llm.empty_stream()
        async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
            await h.say("x" * 6_000)
            await h.idle()
            said = h.channel.messages()[-1]
            assert "too long for the model's context window (2,000 tokens)" in said and "set it aside" in said
            llm.reply("short answer")
            await h.say("a short question")
            await h.idle()
            assert h.channel.messages()[-1] == "short answer"
        assert len(llm.requests) == 5 and user_texts(llm.requests[-1]) == ["a short question"]
    assert llm.rejections == []


@every_api
async def test_a_stream_cut_after_text_is_finished_honestly_not_repeated(store, llm, tmp_path):
    llm.truncate("The answer is forty")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path), llm=llm.settings)) as h:
        await h.say("what is the answer?")
        await h.idle()
        said = h.channel.messages()
    assert len(said) == 1 and said[0].startswith("The answer is forty\n\n")
    assert CUT_OFF.split("(")[0].strip() in said[0] and len(llm.requests) == 1
    run = (await store.runs.list())[0]
    assert (run.stage, run.end_reason) == ("FAILED", "cut_off")


async def test_runs_without_usage_chunks_are_marked_estimated(store, tmp_path):
    async with FakeLLM(usage_chunks=False) as llm:
        llm.reply("a reply of some length")
        config = make_config(llm.base_url, str(tmp_path), llm={"prices": {"test-model": {"input": 1.0, "output": 2.0}}})
        async with running_gateway(store, config) as h:
            await h.say("count me")
            await h.idle()
    run = (await store.runs.list())[0]
    assert run.stage == "SUCCESS" and run.usage_estimated
    assert "partly estimated" in cost_text(await store.runs.session_totals(run.session_id))
    assert run.input_tokens > 0 and run.output_tokens >= len("a reply of some length") // 3
    assert run.cost_nano_usd and run.cost_nano_usd > 0


async def test_runs_with_usage_chunks_are_not_estimated(store, llm, tmp_path):
    llm.reply("counted by the server")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("count me")
        await h.idle()
    assert not (await store.runs.list())[0].usage_estimated
