"""Costs that match the bill: the usage objects servers really send (OpenAI, OpenRouter, vLLM,
llama.cpp, Anthropic's names) counted and priced with cache reads and writes, reasoning and the
provider's own cost; every call counted (summaries too); one figure in /cost, the run records
and the spend caps; transcriptions priced by the minute and refused at a cap. End to end through
Telegram and Slack on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from fakes.llm import Reply
from harness import make_config, running_gateway
from media import voice_bytes
from test_slack_e2e import DM, slack_config
from test_slack_e2e import running as slack_running
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import PRIVATE, running, settle, texts, tg_config

from gateway.budgets.caps import period_key
from gateway.config import Config, LLMConfig, ModelPrice
from gateway.llm import Usage
from gateway.llm.pricing import minutes_cost, usage_cost
from gateway.llm.stream import ChunkParser
from gateway.traces.runs import format_nano_usd

# Claude Sonnet's list prices (USD per million tokens): reads and writes of the cache differ.
PRICE = {"input": 3, "output": 15, "cache_read": 0.3, "cache_write": 3.75}


def with_llm(config: Config, settings: dict[str, Any]) -> Config:
    """`config` with more `llm` settings (tg_config and slack_config take `llm` as the fake)."""
    llm = LLMConfig.model_validate({**config.llm.model_dump(), **settings})
    return config.model_copy(update={"llm": llm})


def chunk(usage: dict[str, Any], **beside: Any) -> dict[str, Any]:
    """A final chunk as the servers send it after the finish: no choices, the usage."""
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
            "usage": usage, **beside}


# Recorded final chunks. OpenAI: the prompt-caching guide's usage, and the reasoning guide's.
OPENAI_CACHED = chunk({
    "prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
    "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0,
                                  "rejected_prediction_tokens": 0},
})
OPENAI_REASONING = chunk({
    "prompt_tokens": 75, "completion_tokens": 1186, "total_tokens": 1261,
    "prompt_tokens_details": {"cached_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 1024, "accepted_prediction_tokens": 0,
                                  "rejected_prediction_tokens": 0},
})
# OpenRouter's usage accounting: its own `cost` (USD) and the cache write of the upstream.
OPENROUTER = chunk({
    "completion_tokens": 2, "completion_tokens_details": {"reasoning_tokens": 0}, "cost": 0.95,
    "cost_details": {"upstream_inference_cost": 19}, "prompt_tokens": 194,
    "prompt_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 100, "audio_tokens": 0}, "total_tokens": 196,
})
# vLLM: no details unless --enable-prompt-tokens-details.
VLLM = chunk({"prompt_tokens": 26, "total_tokens": 46, "completion_tokens": 20, "prompt_tokens_details": None})
# llama.cpp's server: `prompt_tokens_details.cached_tokens` (n_prompt_tokens_cache), and `timings`
# beside the usage, whose `cache_n` is all an older build says of its cache.
LLAMACPP = chunk(
    {"completion_tokens": 10, "prompt_tokens": 25, "total_tokens": 35, "prompt_tokens_details": {"cached_tokens": 12}},
    timings={"cache_n": 12, "prompt_n": 13, "prompt_ms": 40.1, "predicted_n": 10, "predicted_ms": 220.4},
)
LLAMACPP_OLD = chunk(
    {"completion_tokens": 10, "prompt_tokens": 25, "total_tokens": 35},
    timings={"cache_n": 12, "prompt_n": 13, "prompt_ms": 40.1, "predicted_n": 10, "predicted_ms": 220.4},
)
# Anthropic's names (its OpenAI-compatible proxies pass them on): `input_tokens` leaves the cache out.
ANTHROPIC = chunk({"input_tokens": 171, "output_tokens": 96, "cache_creation_input_tokens": 1470,
                   "cache_read_input_tokens": 0})
ANTHROPIC_READ = chunk({"prompt_tokens": 5100, "completion_tokens": 40, "cache_read_input_tokens": 5000,
                        "cache_creation_input_tokens": 0})

# (body, what it counts, nano-USD at PRICE), the figures worked out by hand.
SHAPES = {
    # 86 fresh x 3 + 1920 read x 0.3 + 300 out x 15 = 5334 micro-USD
    "openai": (OPENAI_CACHED, Usage(2006, 300, cached_tokens=1920), 5_334_000),
    # 75 x 3 + 1186 x 15 (the reasoning is output) = 18015
    "openai-reasoning": (OPENAI_REASONING, Usage(75, 1186, reasoning_tokens=1024), 18_015_000),
    # the provider's own $0.95, not 94 x 3 + 100 x 3.75 + 2 x 15
    "openrouter": (OPENROUTER, Usage(194, 2, cache_write_tokens=100, cost_usd=0.95), 950_000_000),
    "vllm": (VLLM, Usage(26, 20), 378_000),  # 26 x 3 + 20 x 15
    "llamacpp": (LLAMACPP, Usage(25, 10, cached_tokens=12), 192_600),  # 13 x 3 + 12 x 0.3 + 10 x 15
    "llamacpp-timings": (LLAMACPP_OLD, Usage(25, 10, cached_tokens=12), 192_600),
    # 171 x 3 + 1470 written x 3.75 + 96 x 15 = 7465.5
    "anthropic": (ANTHROPIC, Usage(1641, 96, cache_write_tokens=1470), 7_465_500),
    "anthropic-read": (ANTHROPIC_READ, Usage(5100, 40, cached_tokens=5000), 2_400_000),  # 100x3 + 5000x0.3 + 40x15
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_each_usage_shape_is_counted_and_priced(shape):
    body, counted, nano = SHAPES[shape]
    (usage,) = ChunkParser().feed(body)
    assert usage == counted
    assert usage_cost(ModelPrice(**PRICE), usage) == nano


def test_a_call_without_a_price_is_unpriced_unless_the_provider_says():
    assert usage_cost(None, Usage(10, 10)) is None
    assert usage_cost(ModelPrice(per_minute=0.006), Usage(10, 10)) is None  # a transcription price only
    assert usage_cost(None, Usage(10, 10, cost_usd=0.0)) == 0  # the provider says it was free
    # the cache's prices default to the input's
    assert usage_cost(ModelPrice(input=1, output=2), Usage(100, 10, cached_tokens=50, cache_write_tokens=50)) == 120_000
    assert usage_cost(ModelPrice(input=1, output=2, cached_input=0.5), Usage(100, 0, cached_tokens=100)) == 50_000


def test_a_minute_of_audio_at_its_price():
    assert minutes_cost(ModelPrice(per_minute=0.006), 30) == 3_000_000
    assert minutes_cost(ModelPrice(input=1, output=1), 30) is None
    with pytest.raises(ValueError, match="input and output"):
        ModelPrice(input=1)


# ---- the same figures everywhere, through both channels --------------------------------------

PLAYED = ("openai", "openrouter", "vllm", "llamacpp-timings", "anthropic")
TOTAL = sum(SHAPES[name][2] for name in PLAYED)
PRICED_LLM = {"prices": {"test-model": PRICE}, "max_tokens": 20}
GLOBAL_CAP = {"caps": [{"scope": "global", "period": "month", "usd": 100}]}


def shape_replies(llm) -> None:  # noqa: ANN001
    for name in PLAYED:
        llm.push(Reply(f"answer {name}", final_chunk=SHAPES[name][0]))


async def same_figures(store, cost_reply: str) -> None:  # noqa: ANN001
    runs = sorted(await store.runs.list(), key=lambda r: r.id)
    assert [r.cost_nano_usd for r in runs] == [SHAPES[name][2] for name in PLAYED]
    assert [r.cache_write_tokens for r in runs] == [0, 100, 0, 0, 1470]
    assert [r.cached_tokens for r in runs] == [1920, 0, 0, 12, 0]
    totals = await store.runs.session_totals(runs[0].session_id)
    assert totals["cost_nano_usd"] == TOTAL
    assert f"cost {format_nano_usd(TOTAL)}" in cost_reply
    assert "1,932 cached, 1,570 written to the cache" in cost_reply
    month = period_key("month", datetime.now(UTC), ZoneInfo("UTC"))
    (counter,) = await store.budgets.current({"month": month})
    assert counter.used_nano_usd == TOTAL and counter.reserved_nano_usd == 0  # the caps count the same


async def test_each_usage_shape_priced_alike_in_cost_runs_and_caps_through_telegram(store, llm, tg, tmp_path):
    shape_replies(llm)
    config = with_llm(tg_config(llm, tg, tmp_path, agent={"tools": []}, budgets=GLOBAL_CAP), PRICED_LLM)
    async with running(store, config) as gateway:
        for n, name in enumerate(PLAYED):
            tg.private_message(PRIVATE, f"question {n}", user_id=PRIVATE)
            await settle(gateway, lambda name=name: f"answer {name}" in texts(tg, PRIVATE))
        tg.private_message(PRIVATE, "/cost", user_id=PRIVATE)
        await settle(gateway, lambda: texts(tg, PRIVATE)[-1].startswith("Model:"))
    await same_figures(store, texts(tg, PRIVATE)[-1])


async def test_each_usage_shape_priced_alike_in_cost_runs_and_caps_through_slack(store, llm, slack, tmp_path):
    shape_replies(llm)
    config = with_llm(slack_config(llm, slack, tmp_path, agent={"tools": []}, budgets=GLOBAL_CAP), PRICED_LLM)
    async with slack_running(store, config, slack) as side:
        for n, name in enumerate(PLAYED):
            await side.dm(f"question {n}")
            await side.settle(lambda name=name: f"answer {name}" in slack_texts(slack, DM))
        await side.dm("/cost")
        await side.settle(lambda: slack_texts(slack, DM)[-1].startswith("Model:"))
    await same_figures(store, slack_texts(slack, DM)[-1])


# ---- summaries are counted on a run ---------------------------------------------------------


async def test_a_compaction_summary_is_counted_on_a_run_of_its_own(store, llm, tmp_path):
    config = make_config(
        llm.base_url, str(tmp_path), llm=PRICED_LLM, agent={"tools": []}, context={"keep_messages": 2}
    )
    async with running_gateway(store, config) as h:
        for n in range(5):
            await h.say(f"message {n}: " + "words " * 40)
            await h.idle()
        llm.reply("The summary.", usage={"prompt_tokens": 1000, "completion_tokens": 100})
        await h.say("/compact")
        await h.idle()
        assert h.channel.messages()[-1].startswith("Compacted")
        await h.say("/cost")
        await h.idle()
        cost_reply = h.channel.messages()[-1]
    compaction = (await store.runs.list())[0]
    assert (compaction.stage, compaction.end_reason, compaction.llm_calls) == ("SUCCESS", "compact", 1)
    assert compaction.cost_nano_usd == 4_500_000  # 1000 x 3 + 100 x 15
    (event,) = [e for e in await store.runs.events(compaction.id) if e.kind == "SUMMARY_CALL"]
    assert event.payload["cost_nano_usd"] == 4_500_000 and event.payload["usage"]["input_tokens"] == 1000
    totals = await store.runs.session_totals(compaction.session_id)
    assert f"cost {format_nano_usd(totals['cost_nano_usd'])}" in cost_reply and totals["cost_nano_usd"] > 4_500_000


# ---- transcription: priced by the minute, refused at a cap -------------------------------------

WHISPER = {"transcription_model": "whisper-1", "max_tokens": 20,
           "prices": {"whisper-1": {"per_minute": 0.006}, "test-model": {"input": 1, "output": 1}}}
# Room for one 30-second note ($0.003) and the calls, not for a second note's $0.003 more.
USER_CAP = {"caps": [{"scope": "user", "period": "day", "usd": 0.005}]}
REFUSED = (
    "⚠️ I saved your voice note, but I could not listen to it: "
    "Daily budget for you reached ($0.005); it resets at 00:00 UTC."
)


async def transcription_counted(store, llm) -> None:  # noqa: ANN001
    first, second = sorted(await store.runs.list(), key=lambda r: r.id)
    (heard,) = [e for e in await store.runs.events(first.id) if e.kind == "TRANSCRIPTION"]
    assert heard.payload["model"] == "whisper-1" and heard.payload["seconds"] == 30
    assert heard.payload["cost_nano_usd"] == 3_000_000
    chat = sum(e.payload["cost_nano_usd"] for e in await store.runs.events(first.id) if e.kind == "LLM_RESPONSE")
    assert first.cost_nano_usd == 3_000_000 + chat and first.llm_calls == 2
    assert not [e for e in await store.runs.events(second.id) if e.kind == "TRANSCRIPTION"]
    assert len(llm.transcriptions) == 1  # the second note was never sent to the server
    (counter,) = await store.budgets.current({"day": period_key("day", datetime.now(UTC), ZoneInfo("UTC"))})
    assert counter.used_nano_usd == first.cost_nano_usd + second.cost_nano_usd  # the caps' figure is the runs'


async def test_voice_notes_are_priced_by_the_minute_and_refused_at_the_cap_through_telegram(
    store, llm, tg, tmp_path
) -> None:
    first, second = voice_bytes(), voice_bytes() + b"\x00"
    llm.transcripts[first] = "remind me to buy milk"
    llm.transcripts[second] = "and bread"
    base = tg_config(llm, tg, tmp_path, telegram={"api_file_url": f"{tg.url}/file/bot"})
    config = with_llm(
        tg_config(llm, tg, tmp_path, telegram=base.telegram.model_dump(), agent={"tools": []}, budgets=USER_CAP),
        WHISPER,
    )
    async with running(store, config) as gateway:
        for n, audio in enumerate((first, second)):
            voice = tg.files.voice(audio, duration=30)  # the platform's length: the server says none
            tg.enqueue(tg.message_update(PRIVATE, "", user_id=PRIVATE, media={"voice": voice}))
            await settle(gateway, lambda n=n: texts(tg, PRIVATE).count("ok") == n + 1)
    assert texts(tg, PRIVATE) == ["ok", REFUSED, "ok"]
    await transcription_counted(store, llm)


async def test_audio_is_priced_by_the_servers_minutes_and_refused_at_the_cap_through_slack(
    store, llm, slack, tmp_path
) -> None:
    from test_attachments_slack import share_in_dm

    first, second = voice_bytes(), voice_bytes() + b"\x00"
    llm.transcripts[first] = "remind me to buy milk"
    llm.transcripts[second] = "and bread"
    llm.transcription_extra = {"usage": {"type": "duration", "seconds": 30}}  # OpenAI's answer says how long
    config = with_llm(
        slack_config(
            llm, slack, tmp_path, agent={"tools": []}, budgets=USER_CAP, attachments={"download_backoff_s": 0.01}
        ),
        WHISPER,
    )
    async with slack_running(store, config, slack) as side:
        for n, audio in enumerate((first, second)):
            # A clip recorded in Slack says its length; the server's answer says it too (and is what is billed).
            file = slack.shared.share(audio, f"clip{n}.ogg", "audio/ogg", subtype="slack_audio", duration_ms=30_000)
            await share_in_dm(side, "", [file])
            await side.settle(lambda n=n: slack_texts(slack, DM).count("ok") == n + 1)
    said = slack_texts(slack, DM)
    assert said[0] == "ok" and said[2] == "ok"
    assert said[1] == REFUSED.replace("voice note", "audio file clip1.ogg")
    await transcription_counted(store, llm)
