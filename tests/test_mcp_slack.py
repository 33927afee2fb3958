"""MCP tools end to end through Slack: the test MCP server over Streamable HTTP on loopback
(and over stdio) <- the gateway's MCP client -> turns, approvals and questions clicked in
FakeSlack through the real bolt app and slack_sdk, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from fakes.llm import Reply
from mcp_support import http_server, mcp_section, notes, offered, stdio_server, until_running
from test_slack_e2e import (
    CHANNEL,
    bot_messages,
    buttons,
    has_prompt,
    outcome,
    prompt_message,
    running,
    slack_config,
    texts,
    tool_results,
)

from gateway.approvals.policy import AUTO_DENIED, rejection_text


@pytest.fixture
async def http_url(tmp_path):
    async with http_server(tmp_path / "state") as url:
        yield url


def over_http(llm, slack, tmp_path, url, **sections):
    return slack_config(
        llm, slack, tmp_path, mcp=mcp_section(t={"url": url, "trusted": True, "timeout_s": 20}), **sections
    )


def over_stdio(llm, slack, tmp_path, **sections):
    return slack_config(
        llm, slack, tmp_path, mcp=mcp_section(t=stdio_server(tmp_path / "state", trusted=True)), **sections
    )


async def ask_for_note(s, llm) -> dict:
    llm.tool_call("mcp__t__write_note", {"text": "ship it"}, id="w1")
    llm.reply("Noted.")
    await s.mention("note it")
    await s.settle(lambda: has_prompt(s.fake))
    return prompt_message(s.fake)


async def test_over_http_tools_are_offered_and_a_click_approves_the_call(store, llm, slack, tmp_path, http_url) -> None:
    async with running(store, over_http(llm, slack, tmp_path, http_url), slack) as s:
        await until_running(s.gateway)
        assert s.gateway.mcp.summary()["t"]["protocol"] and s.gateway.mcp.summary()["t"]["tools"] == 10
        prompt = await ask_for_note(s, llm)
        assert "mcp__t__write_note" in str(prompt["blocks"])
        assert "mcp__t__write_note" in offered(llm.requests[0])
        assert notes(tmp_path / "state") == []
        await s.click(prompt, "Approve")
        await s.settle(lambda: "Noted." in texts(slack))
        assert notes(tmp_path / "state") == ["ship it"]
        assert tool_results(llm.requests[1]) == ["noted: ship it"]
        assert outcome(slack.message(CHANNEL, prompt["ts"])) == "✅ Approved by Ann"
        runs = await store.runs.list()
        calls = [e.payload for r in runs for e in await store.runs.events(r.id) if e.kind == "MCP_CALL"]
        assert [(c["server"], c["tool"], c["status"]) for c in calls] == [("t", "write_note", "ok")]


async def test_a_click_on_deny_keeps_the_call_from_the_server(store, llm, slack, tmp_path) -> None:
    async with running(store, over_stdio(llm, slack, tmp_path), slack) as s:
        await until_running(s.gateway)
        prompt = await ask_for_note(s, llm)
        await s.click(prompt, "Deny")
        await s.settle(lambda: "Noted." in texts(slack))
        assert notes(tmp_path / "state") == []
        assert tool_results(llm.requests[1]) == [rejection_text(None)]


async def test_over_http_an_elicitation_is_answered_by_a_click(store, llm, slack, tmp_path, http_url) -> None:
    llm.tool_call("mcp__t__confirm", {"item": "door"}, id="c1")
    llm.responder = lambda request: Reply(f"result: {tool_results(request)[-1]}")
    async with running(store, over_http(llm, slack, tmp_path, http_url), slack) as s:
        await until_running(s.gateway)
        await s.mention("paint the door")
        await s.settle(lambda: has_prompt(slack))
        prompt = prompt_message(slack)
        assert "Which colour?" in prompt["text"] and [b["text"]["text"] for b in buttons(prompt)] == [
            "red",
            "green",
            "blue",
            "Decline",
        ]
        await s.click(prompt, "blue")
        await s.settle(lambda: any(t.startswith("result:") for t in texts(slack)))
        assert [t for t in texts(slack) if t.startswith("result:")] == ["result: painted door blue"]
        assert outcome(slack.message(CHANNEL, prompt["ts"])) == "💬 Answered by Ann: blue"


async def test_an_elicitation_answered_by_typing_in_the_thread(store, llm, slack, tmp_path) -> None:
    llm.tool_call("mcp__t__rename", {"item": "door"}, id="r1")
    llm.responder = lambda request: Reply(f"result: {tool_results(request)[-1]}")
    async with running(store, over_stdio(llm, slack, tmp_path), slack) as s:
        await until_running(s.gateway)
        mention = await s.mention("rename the door")
        await s.settle(lambda: has_prompt(slack))
        prompt = prompt_message(slack)
        assert "What should it be called?" in prompt["text"] and [b["text"]["text"] for b in buttons(prompt)] == [
            "Decline"
        ]
        await s.say_in_thread(mention["ts"], "Front door")
        await s.settle(lambda: any(t.startswith("result:") for t in texts(slack)))
        assert [t for t in texts(slack) if t.startswith("result:")] == ["result: renamed door to Front door"]
        assert len(llm.requests) == 2  # the typed answer continued the parked call; no new turn


async def test_a_scheduled_run_auto_denies_the_call_and_delivers_to_slack(
    store, llm, slack, tmp_path, http_url
) -> None:
    job = {
        "name": "nightly",
        "cron": "0 3 * * *",
        "prompt": "Note the night.",
        "deliver_to": f"slack:{CHANNEL}:1700000000.000100",
    }
    llm.tool_call("mcp__t__write_note", {"text": "night"}, id="w1")
    llm.reply("Could not note the night.")
    async with running(
        store, over_http(llm, slack, tmp_path, http_url, scheduler={"enabled": True, "jobs": [job]}), slack
    ) as s:
        await until_running(s.gateway)
        schedule = await store.schedules.by_name("nightly")
        await s.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
        await s.settle(lambda: any("Could not note" in m.get("text", "") for m in bot_messages(slack)))
        delivered = next(m for m in bot_messages(slack) if "Could not note" in m.get("text", ""))
        assert delivered.get("thread_ts") == "1700000000.000100" and "Run again" in str(delivered["blocks"])
        assert notes(tmp_path / "state") == []
        assert tool_results(llm.requests[1]) == [AUTO_DENIED]


async def test_over_http_a_schema_change_asks_again_after_a_grant(store, llm, slack, tmp_path, http_url) -> None:
    async with running(store, over_http(llm, slack, tmp_path, http_url), slack) as s:
        await until_running(s.gateway)
        llm.tool_call("mcp__t__grow", {"size": 1}, id="g1")
        llm.reply("grew once")
        mention = await s.mention("grow")
        await s.settle(lambda: has_prompt(slack))
        first = prompt_message(slack)
        old = s.gateway.registry.get("mcp__t__grow").grant_key
        await s.click(first, "Allow 15 min")
        await s.settle(lambda: "grew once" in texts(slack))
        await s.gateway.mcp.wait_for(
            lambda m: (spec := m.registry.get("mcp__t__grow")) is not None and spec.grant_key != old, 10
        )
        llm.tool_call("mcp__t__grow", {"size": 2, "unit": "m"}, id="g2")
        llm.reply("grew twice")
        await s.say_in_thread(mention["ts"], "grow again")
        await s.settle(
            lambda: (
                len(llm.requests) == 3 and any(buttons(m) for m in slack.messages[CHANNEL] if m["ts"] != first["ts"])
            )
        )
        second = next(m for m in slack.messages[CHANNEL] if buttons(m))
        assert second["ts"] != first["ts"]
        await s.click(second, "Approve")
        await s.settle(lambda: "grew twice" in texts(slack))
        assert tool_results(llm.requests[-1])[-1] == "grew 2m"


async def test_a_crash_mid_call_is_a_clear_tool_error(store, llm, slack, tmp_path) -> None:
    llm.tool_call("mcp__t__crash", {}, id="x1")
    llm.reply("It crashed.")
    async with running(store, over_stdio(llm, slack, tmp_path), slack) as s:
        await until_running(s.gateway)
        await s.mention("crash it")
        await s.settle(lambda: "It crashed." in texts(slack))
        assert "stopped during the call" in tool_results(llm.requests[1])[0]
        await s.gateway.mcp.wait_for(lambda m: m.states["t"].restarts >= 1 and m.states["t"].status == "running", 20)
        assert s.gateway.mcp.summary()["t"]["tools"] == 10


async def test_readyz_shows_each_server_without_depending_on_it(store, llm, slack, tmp_path) -> None:
    import aiohttp

    servers = mcp_section(t=stdio_server(tmp_path / "state"), broken={"url": "http://127.0.0.1:9/mcp"})
    async with running(store, slack_config(llm, slack, tmp_path, mcp=servers), slack) as s:
        await until_running(s.gateway)
        await s.gateway.mcp.wait_for(lambda m: m.states["broken"].status == "failed", 20)
        assert s.gateway.http is not None
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{s.gateway.http.port}/readyz") as response:
                body = await response.json()
                assert response.status == 200 and body["ready"] is True
        assert body["mcp"]["t"]["status"] == "running" and body["mcp"]["t"]["tools"] == 10
        assert body["mcp"]["broken"]["status"] == "failed" and body["mcp"]["broken"]["error"]
