"""Mid-call elicitation and sampling through Slack: the test MCP server on an older protocol,
over Streamable HTTP on loopback and over stdio, asks inside the call; the question is clicked
or typed in the thread of FakeSlack through the real bolt app, and sampling is priced. SQLite
and PostgreSQL."""

from __future__ import annotations

import pytest
from fakes.llm import Reply
from helpers import until
from mcp_support import http_server, mcp_section, stdio_server, until_running
from test_budgets import priced
from test_slack_e2e import (
    CHANNEL,
    buttons,
    has_prompt,
    outcome,
    prompt_message,
    running,
    slack_config,
    texts,
    tool_results,
)

LEGACY = {"trusted": True, "protocol": "legacy"}


@pytest.fixture
async def http_url(tmp_path):
    async with http_server(tmp_path / "state") as url:
        yield url


def over_http(llm, slack, tmp_path, url, **server):
    return slack_config(llm, slack, tmp_path, mcp=mcp_section(t={"url": url, "timeout_s": 20, **LEGACY, **server}))


def over_stdio(llm, slack, tmp_path, **server):
    return slack_config(llm, slack, tmp_path, mcp=mcp_section(t=stdio_server(tmp_path / "state", **LEGACY, **server)))


def results(slack) -> list[str]:  # noqa: ANN001
    return [t for t in texts(slack) if t.startswith("result:")]


async def test_over_http_a_mid_call_question_is_answered_by_a_click(store, llm, slack, tmp_path, http_url) -> None:
    llm.tool_call("mcp__t__confirm", {"item": "door"}, id="c1")
    llm.responder = lambda request: Reply(f"result: {tool_results(request)[-1]}")
    async with running(store, over_http(llm, slack, tmp_path, http_url), slack) as s:
        await until_running(s.gateway)
        assert s.gateway.mcp.summary()["t"]["protocol"] < "2026"
        await s.mention("paint the door")
        await until(lambda: has_prompt(slack), 20)
        prompt = prompt_message(slack)
        assert "Which colour?" in prompt["text"]
        assert [b["text"]["text"] for b in buttons(prompt)] == ["red", "green", "blue", "Decline"]
        (run,) = await store.runs.list()
        assert run.stage == "RUNNING"
        await s.click(prompt, "blue")
        await s.settle(lambda: bool(results(slack)))
        assert results(slack) == ["result: painted door blue"]
        assert outcome(slack.message(CHANNEL, prompt["ts"])) == "💬 Answered by Ann: blue"


async def test_a_mid_call_question_declined_by_a_click(store, llm, slack, tmp_path) -> None:
    llm.tool_call("mcp__t__confirm", {"item": "door"}, id="c1")
    llm.responder = lambda request: Reply(f"result: {tool_results(request)[-1]}")
    async with running(store, over_stdio(llm, slack, tmp_path), slack) as s:
        await until_running(s.gateway)
        await s.mention("paint the door")
        await until(lambda: has_prompt(slack), 20)
        await s.click(prompt_message(slack), "Decline")
        await s.settle(lambda: bool(results(slack)))
        assert results(slack) == ["result: not painted (decline)"]


async def test_a_mid_call_question_answered_by_typing_in_the_thread(store, llm, slack, tmp_path) -> None:
    llm.tool_call("mcp__t__rename", {"item": "door"}, id="r1")
    llm.responder = lambda request: Reply(f"result: {tool_results(request)[-1]}")
    async with running(store, over_stdio(llm, slack, tmp_path), slack) as s:
        await until_running(s.gateway)
        mention = await s.mention("rename the door")
        await until(lambda: has_prompt(slack), 20)
        await s.say_in_thread(mention["ts"], "Back door")
        await s.settle(lambda: bool(results(slack)))
        assert results(slack) == ["result: renamed door to Back door"]
        assert len(llm.requests) == 2


async def test_over_http_mid_call_sampling_is_answered_and_priced(store, llm, slack, tmp_path, http_url) -> None:
    llm.tool_call("mcp__t__haiku", {"topic": "rain"}, id="h1", usage={"prompt_tokens": 10, "completion_tokens": 2})
    llm.reply("rain on the roof", usage={"prompt_tokens": 100, "completion_tokens": 20})
    llm.reply("Your poem.", usage={"prompt_tokens": 10, "completion_tokens": 2})
    async with running(store, priced(over_http(llm, slack, tmp_path, http_url, sampling=True)), slack) as s:
        await until_running(s.gateway)
        await s.mention("a haiku please")
        await s.settle(lambda: "Your poem." in texts(slack))
        assert tool_results(llm.requests[2]) == ["haiku: rain on the roof"]
        (run,) = await store.runs.list()
        assert run.llm_calls == 3 and run.cost_nano_usd == 144_000_000  # 144 tokens at $0.001


async def test_a_url_mode_question_is_a_link_button_and_done(store, llm, slack, tmp_path) -> None:
    cfg = over_stdio(llm, slack, tmp_path)
    cfg.mcp.servers["t"].command.append("--extra")
    llm.tool_call("mcp__t__sign_in", {"service": "drive"}, id="s1")
    llm.responder = lambda request: Reply(f"result: {tool_results(request)[-1]}")
    async with running(store, cfg, slack) as s:
        await until_running(s.gateway)
        await s.mention("sign me in")
        await until(lambda: has_prompt(slack), 20)
        prompt = prompt_message(slack)
        link, done, decline = buttons(prompt)
        assert link["text"]["text"] == "Open" and link["url"] == "https://auth.example/drive" and "value" not in link
        assert (done["text"]["text"], decline["text"]["text"]) == ("Done", "Decline")
        await s.click(prompt, "Done")
        await s.settle(lambda: bool(results(slack)))
        assert results(slack) == ["result: sign-in accept"]
