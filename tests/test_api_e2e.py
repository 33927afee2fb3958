"""Each model API end to end through Telegram and Slack (the real libraries against their fakes):
the turns the Chat Completions path is tested with elsewhere (tests/test_telegram_e2e.py,
tests/test_slack_e2e.py, marked `every_api`), and what only some APIs have: thinking carried
through a turn's tool rounds, retries after 529 and 429, a stream cut, a fallback to a model on
another API inside one turn."""

from __future__ import annotations

from fakes.anthropic import thinking_blocks
from fakes.llm import FakeLLM, Reply
from helpers import every_api, tool_results
from test_slack_e2e import running as slack_running
from test_slack_e2e import slack_config
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import PRIVATE, running, settle, texts, tg_config


async def test_thinking_goes_back_unchanged_through_two_tool_rounds_in_telegram(store, tg, tmp_path) -> None:
    from fakes.anthropic import FakeAnthropic

    async with FakeAnthropic() as llm:
        llm.tool_call("clock", {}, id="toolu_1", reasoning="The clock first.", reasoning_field="redacted")
        llm.tool_call("clock", {}, id="toolu_2", reasoning="Once more, to be sure.")
        llm.reply("It is late.", reasoning="Both agree.")
        price = {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75}
        settings = {"reasoning": "low", "prices": {"test-model": price}}
        config = tg_config(llm, tg, tmp_path, llm_settings=settings, agent={"system_prompt": "Rules. " * 800})
        async with running(store, config) as gateway:
            tg.private_message(PRIVATE, "what time is it?")
            await settle(gateway, lambda: "It is late." in texts(tg, PRIVATE))
            tg.private_message(PRIVATE, "thanks")
            await settle(gateway, lambda: len(llm.requests) == 4)
    assert llm.accepted == 4 and not llm.rejections
    first, second, third, next_turn = llm.requests
    assert all(r["thinking"] == {"type": "enabled", "budget_tokens": 2048} for r in llm.requests)
    assert thinking_blocks(first) == []
    assert [b["type"] for b in thinking_blocks(second)] == ["thinking", "redacted_thinking"]
    assert thinking_blocks(third)[:2] == thinking_blocks(second)
    assert [b.get("thinking") for b in thinking_blocks(third)][2] == "Once more, to be sure."
    assert thinking_blocks(next_turn) == []  # a finished turn's thinking is left out, as the API allows
    runs = sorted(await store.runs.list(), key=lambda r: r.id)
    assert [r.stage for r in runs] == ["SUCCESS", "SUCCESS"]
    # the tools and the system prompt were written to the cache by the first call and read by the others
    assert runs[0].cache_write_tokens >= 1024 and runs[0].cached_tokens >= runs[0].cache_write_tokens
    assert runs[1].cached_tokens >= 1024
    fresh = runs[0].input_tokens - runs[0].cached_tokens - runs[0].cache_write_tokens
    expected = fresh * 3.0 + runs[0].cached_tokens * 0.3 + runs[0].cache_write_tokens * 3.75
    expected += runs[0].output_tokens * 15.0
    assert runs[0].cost_nano_usd is not None  # USD per million tokens, in nano-USD, rounded per call (3 calls)
    assert abs(runs[0].cost_nano_usd - expected * 1000) <= 3


async def test_thinking_goes_back_unchanged_through_two_tool_rounds_in_slack(store, slack, tmp_path) -> None:
    from fakes.anthropic import FakeAnthropic

    async with FakeAnthropic() as llm:
        llm.tool_call("clock", {}, id="toolu_1", reasoning="Look.")
        llm.tool_call("clock", {}, id="toolu_2", reasoning="Look again.")
        llm.reply("Noon.")
        config = slack_config(llm, slack, tmp_path, llm_settings={"reasoning": "medium"})
        async with slack_running(store, config, slack) as s:
            await s.mention("time?")
            await s.settle(lambda: "Noon." in slack_texts(slack))
    assert llm.accepted == 3 and not llm.rejections
    assert [b["thinking"] for b in thinking_blocks(llm.requests[2])] == ["Look.", "Look again."]


@every_api
async def test_a_turn_retries_after_an_overload_and_a_rate_limit(store, llm, tg, tmp_path) -> None:
    llm.error(529 if llm.settings.get("api") == "anthropic" else 503, message="Overloaded")
    llm.error(429, retry_after=0)
    llm.reply("patience pays")
    async with running(store, tg_config(llm, tg, tmp_path, llm_settings={"max_retries": 3})) as gateway:
        tg.private_message(PRIVATE, "hello")
        await settle(gateway, lambda: "patience pays" in texts(tg, PRIVATE))
    assert len(llm.requests) == 3


@every_api
async def test_a_stream_cut_before_the_answer_is_asked_again(store, llm, tg, tmp_path) -> None:
    llm.truncate("")
    llm.tool_call("clock", {}, id="toolu_9")
    llm.responder = lambda request: Reply(f"the tool said {len(tool_results(request))} thing")
    async with running(store, tg_config(llm, tg, tmp_path, llm_settings={"max_retries": 2})) as gateway:
        tg.private_message(PRIVATE, "time?")
        await settle(gateway, lambda: any("the tool said 1 thing" in t for t in texts(tg, PRIVATE)))
    assert len(llm.requests) == 3


@every_api
async def test_a_fallback_goes_to_a_model_on_another_api_inside_one_turn(store, llm, tg, tmp_path) -> None:
    """The first round is answered by the configured model, the second (after its server fails)
    by a model of llm.fallback on a server of another API."""
    from fakes.anthropic import FakeAnthropic

    other = FakeLLM() if llm.settings else FakeAnthropic()
    async with other:
        llm.tool_call("clock", {}, id="toolu_5")
        llm.error(500, message="down")
        other.reply("answered by the other API")
        models = {"spare": {"model": "spare-model", "base_url": other.base_url, **(other.settings or {"api": "chat"})}}
        config = tg_config(llm, tg, tmp_path, llm_settings={"max_retries": 0, "models": models, "fallback": ["spare"]})
        async with running(store, config) as gateway:
            tg.private_message(PRIVATE, "time?")
            await settle(gateway, lambda: "answered by the other API" in texts(tg, PRIVATE))
    assert len(llm.requests) == 2 and len(other.requests) == 1
    assert len(tool_results(other.requests[0])) == 1  # the first model's round, in the other API's shape


@every_api
async def test_a_model_that_refuses_is_shown_its_refusal_and_the_turn_ends(store, llm, tg, tmp_path) -> None:
    llm.reply("I can't help with that.", finish_reason="content_filter")
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "something out of bounds")
        await settle(gateway, lambda: "I can't help with that." in texts(tg, PRIVATE))
    (run,) = await store.runs.list()
    assert run.stage == "SUCCESS" and len(llm.requests) == 1


async def test_thinking_survives_an_approval_and_a_restart_between_two_rounds(store, tg, tmp_path) -> None:
    """The round that asked for approval is parked with its thinking; another gateway process
    resumes the turn when the button is pressed, and sends that thinking back unchanged."""
    from fakes.anthropic import FakeAnthropic
    from test_telegram_e2e import button, has_prompt, prompt_message

    async with FakeAnthropic() as llm:
        llm.tool_call("write_file", {"path": "n.txt", "content": "hi"}, id="toolu_w", reasoning="Write it down.")
        llm.reply("Written.", reasoning="Done it.")
        config = tg_config(llm, tg, tmp_path, llm_settings={"reasoning": "high"})
        async with running(store, config) as gateway:
            tg.private_message(PRIVATE, "write a note")
            await settle(gateway, lambda: has_prompt(tg, PRIVATE))
            prompt = prompt_message(tg, PRIVATE)
        async with running(store, config) as gateway:
            tg.press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
            await settle(gateway, lambda: "Written." in texts(tg, PRIVATE))
    assert llm.accepted == 2 and not llm.rejections
    assert thinking_blocks(llm.requests[1]) == llm.issued["toolu_w"]
    assert llm.requests[1]["thinking"]["budget_tokens"] == 24576
