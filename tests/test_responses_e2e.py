"""A reasoning model on the OpenAI Responses API, end to end through Telegram and Slack (the
real python-telegram-bot and slack_sdk/bolt against their fakes): its encrypted reasoning items
come back with each round and go back unchanged in the next rounds of the same turn, across an
approval too, and the strict Responses fake (tests/fakes/llm_responses.py) accepts every request.

The scenarios every API shares (a tool, an approval, a question, a refusal, retries, a cut
stream, a fallback to another API) are the tests marked `every_api` (tests/test_api_e2e.py,
tests/test_telegram_e2e.py, tests/test_slack_e2e.py), which run on the Responses fake too."""

from __future__ import annotations

from typing import Any

from fakes.llm_responses import FakeResponses
from fakes.responses_rules import user_texts
from helpers import session_file
from test_slack_e2e import has_prompt as slack_has_prompt
from test_slack_e2e import prompt_message as slack_prompt
from test_slack_e2e import running as slack_running
from test_slack_e2e import slack_config
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import PRIVATE, button, has_prompt, prompt_message, running, settle, texts, tg_config

REASONING = {"reasoning": "medium"}


def reasoning_items(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in request["input"] if item["type"] == "reasoning"]


def script_two_rounds(llm: FakeResponses) -> None:
    llm.tool_call("clock", {}, id="call_1", reasoning="The clock knows the time.")
    llm.tool_call("clock", {"tz": "UTC"}, id="call_2", reasoning="Check it in UTC as well.")
    llm.reply("It is late, in both zones.", reasoning="Both answers agree.")


def assert_carried_through_the_turn(llm: FakeResponses) -> None:
    assert llm.rejections == [] and llm.accepted == 3
    first, second = list(llm.issued.values())[:2]
    assert reasoning_items(llm.requests[0]) == []
    assert reasoning_items(llm.requests[1]) == [first]
    assert reasoning_items(llm.requests[2]) == [first, second]  # unchanged, in order
    for request in llm.requests:
        assert request["reasoning"] == {"effort": "medium"} and request["store"] is False
        assert request["include"] == ["reasoning.encrypted_content"]


async def test_a_reasoning_turn_of_two_tool_rounds_carries_its_reasoning_in_telegram(store, tg, tmp_path) -> None:
    async with FakeResponses() as llm:
        script_two_rounds(llm)
        async with running(store, tg_config(llm, tg, tmp_path, llm_settings=REASONING)) as gateway:
            tg.private_message(PRIVATE, "what time is it?")
            await settle(gateway, lambda: "It is late, in both zones." in texts(tg, PRIVATE))
    assert_carried_through_the_turn(llm)
    assert user_texts(llm.requests[0]) == ["what time is it?"]
    run = (await store.runs.list())[-1]
    assert run.stage == "SUCCESS"


async def test_a_reasoning_turn_of_two_tool_rounds_carries_its_reasoning_in_slack(store, slack, tmp_path) -> None:
    async with FakeResponses() as llm:
        script_two_rounds(llm)
        async with slack_running(store, slack_config(llm, slack, tmp_path, llm_settings=REASONING), slack) as s:
            await s.mention("what time is it?")
            await s.settle(lambda: "It is late, in both zones." in slack_texts(slack))
    assert_carried_through_the_turn(llm)


async def test_reasoning_waits_with_an_approval_across_a_restart_and_the_next_turn_starts_without_it(
    store, tg, tmp_path
) -> None:
    """The round that asked for approval is parked with its reasoning item; another gateway
    process resumes the turn when the button is pressed and sends the item back unchanged."""
    async with FakeResponses() as llm:
        llm.tool_call("write_file", {"path": "note.txt", "content": "hello"}, id="w1", reasoning="Write it down.")
        llm.reply("Written.")
        config = tg_config(llm, tg, tmp_path, llm_settings=REASONING)
        async with running(store, config) as gateway:
            tg.private_message(PRIVATE, "write a note")
            await settle(gateway, lambda: has_prompt(tg, PRIVATE))
            prompt = prompt_message(tg, PRIVATE)
        async with running(store, config) as gateway:
            tg.press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
            await settle(gateway, lambda: "Written." in texts(tg, PRIVATE))
            assert session_file(tmp_path / "ws", "note.txt").read_text() == "hello"

            llm.reply("You are welcome.")
            tg.private_message(PRIVATE, "thanks")
            await settle(gateway, lambda: "You are welcome." in texts(tg, PRIVATE))
    [issued] = llm.issued.values()
    assert reasoning_items(llm.requests[1]) == [issued]  # kept while the turn waited for the tap, restart and all
    assert reasoning_items(llm.requests[2]) == []  # a finished turn's reasoning is not sent again
    assert llm.rejections == [] and llm.accepted == 3


async def test_reasoning_waits_with_an_approval_in_slack(store, slack, tmp_path) -> None:
    async with FakeResponses() as llm:
        llm.tool_call("write_file", {"path": "note.txt", "content": "hello"}, id="w1", reasoning="Write it down.")
        llm.reply("Written.")
        async with slack_running(store, slack_config(llm, slack, tmp_path, llm_settings=REASONING), slack) as s:
            await s.mention("write a note")
            await s.settle(lambda: slack_has_prompt(slack))
            await s.click(slack_prompt(slack), "Approve")
            await s.settle(lambda: "Written." in slack_texts(slack))
    [issued] = llm.issued.values()
    assert reasoning_items(llm.requests[1]) == [issued]
    assert llm.rejections == [] and llm.accepted == 2


async def test_a_fallback_to_another_responses_server_gets_no_reasoning_it_did_not_produce(
    store, tg, tmp_path
) -> None:
    """Encrypted reasoning is sealed for the model that produced it: when the turn's second round
    falls back to a model on another Responses server, that server is sent the first round's call
    and output but not the other model's reasoning items (which it would refuse as forged)."""
    async with FakeResponses() as llm, FakeResponses() as other:
        llm.tool_call("clock", {}, id="call_1", reasoning="The clock knows the time.")
        llm.error(500, message="down")
        other.reply("answered by the spare")
        models = {"spare": {"model": "spare-model", "base_url": other.base_url, "api": "responses", **REASONING}}
        settings = {**REASONING, "max_retries": 0, "models": models, "fallback": ["spare"]}
        async with running(store, tg_config(llm, tg, tmp_path, llm_settings=settings)) as gateway:
            tg.private_message(PRIVATE, "what time is it?")
            await settle(gateway, lambda: "answered by the spare" in texts(tg, PRIVATE))
    assert other.rejections == [] and other.accepted == 1
    sent = other.requests[0]["input"]
    assert reasoning_items(other.requests[0]) == []
    assert [item["type"] for item in sent if item["type"].startswith("function_call")] == [
        "function_call", "function_call_output"
    ]
