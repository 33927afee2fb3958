"""MCP tools end to end through Telegram: the real test MCP server (a subprocess speaking
stdio, written with the SDK) <- the gateway's MCP client -> turns, approvals and questions
shown through real PTB to FakeTelegram, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC

from fakes.llm import Reply
from helpers import session_file
from mcp_support import mcp_section, notes, offered, stdio_server, until_running
from test_telegram_e2e import (
    PRIVATE,
    button,
    has_prompt,
    prompt_message,
    running,
    settle,
    texts,
    tg_config,
    tool_results,
)

from gateway.approvals.policy import AUTO_DENIED, rejection_text


def config(llm, tg, tmp_path, **server):
    return tg_config(llm, tg, tmp_path, mcp=mcp_section(t=stdio_server(tmp_path / "state", **server)))


async def test_tools_are_offered_and_a_trusted_read_only_tool_runs_without_asking(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__lookup", {"key": "colour"}, id="l1")
    llm.reply("Looked it up.")
    async with running(store, config(llm, tg, tmp_path, trusted=True)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "look it up")
        await settle(gateway, lambda: "Looked it up." in texts(tg, PRIVATE))
        names = offered(llm.requests[0])
        assert {"mcp__t__lookup", "mcp__t__write_note", "mcp__t__confirm"} <= set(names)
        lookup = next(t for t in llm.requests[0]["tools"] if t["function"]["name"] == "mcp__t__lookup")
        assert lookup["function"]["parameters"] == {
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
        }
        assert tool_results(llm.requests[1]) == ["value of colour"]
        assert not any(m.buttons for m in tg.bot_messages(PRIVATE))
        run = (await store.runs.list())[0]
        events = await store.runs.events(run.id)
        (mcp_call,) = [e.payload for e in events if e.kind == "MCP_CALL"]
        assert (mcp_call["server"], mcp_call["tool"], mcp_call["status"], mcp_call["result_chars"]) == (
            "t",
            "lookup",
            "ok",
            len("value of colour"),
        )
        assert mcp_call["duration_ms"] > 0
        request = next(e.payload for e in events if e.kind == "LLM_REQUEST")
        assert request["mcp_schema_chars"] > 0


async def test_an_untrusted_server_needs_approval_even_for_read_only_tools(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__lookup", {"key": "k"}, id="l1")
    llm.reply("done")
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "look it up")
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        assert "mcp__t__lookup" in prompt_message(tg, PRIVATE).text


async def test_a_side_effecting_tool_runs_once_approved_by_button(store, llm, tg, tmp_path) -> None:
    state = tmp_path / "state"
    llm.tool_call("mcp__t__write_note", {"text": "buy milk"}, id="w1")
    llm.reply("Noted.")
    async with running(store, config(llm, tg, tmp_path, trusted=True)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "note it")
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        prompt = prompt_message(tg, PRIVATE)
        assert "mcp__t__write_note" in prompt.text and "buy milk" in prompt.text
        assert notes(state) == []
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
        await settle(gateway, lambda: "Noted." in texts(tg, PRIVATE))
        assert notes(state) == ["buy milk"]
        assert tool_results(llm.requests[1]) == ["noted: buy milk"]


async def test_a_denied_call_never_reaches_the_server(store, llm, tg, tmp_path) -> None:
    state = tmp_path / "state"
    llm.tool_call("mcp__t__write_note", {"text": "buy milk"}, id="w1")
    llm.reply("Not noted.")
    async with running(store, config(llm, tg, tmp_path, trusted=True)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "note it")
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        prompt = prompt_message(tg, PRIVATE)
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Deny"), user_id=PRIVATE)
        await settle(gateway, lambda: "Not noted." in texts(tg, PRIVATE))
        assert notes(state) == []
        assert tool_results(llm.requests[1]) == [rejection_text(None)]


async def test_a_rule_allows_an_mcp_tool_by_glob_and_argument(store, llm, tg, tmp_path) -> None:
    state = tmp_path / "state"
    rules = [{"tool": "mcp__t__*", "args": {"text": "safe *"}, "action": "allow"}]
    cfg = tg_config(llm, tg, tmp_path, approvals={"rules": rules}, mcp=mcp_section(t=stdio_server(state)))
    llm.tool_call("mcp__t__write_note", {"text": "safe words"}, id="w1")
    llm.tool_call("mcp__t__write_note", {"text": "risky words"}, id="w2")
    llm.reply("ok")
    async with running(store, cfg) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "note both")
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        assert notes(state) == ["safe words"]  # the rule let it through; the other waits for a human
        assert "risky words" in prompt_message(tg, PRIVATE).text


async def test_a_scheduled_run_auto_denies_the_call(store, llm, tg, tmp_path) -> None:
    from datetime import datetime

    state = tmp_path / "state"
    job = {"name": "nightly", "cron": "0 3 * * *", "prompt": "Write the note.", "deliver_to": f"telegram:{PRIVATE}"}
    cfg = tg_config(
        llm,
        tg,
        tmp_path,
        scheduler={"enabled": True, "jobs": [job]},
        mcp=mcp_section(t=stdio_server(state, trusted=True)),
    )
    llm.tool_call("mcp__t__write_note", {"text": "night"}, id="w1")
    llm.tool_call("mcp__t__confirm", {"item": "fence"}, id="c1")
    llm.reply("Could not write the note.")
    async with running(store, cfg) as gateway:
        await until_running(gateway)
        schedule = await store.schedules.by_name("nightly")
        await gateway.scheduler.fire(schedule.id, datetime.now(UTC))
        await settle(gateway, lambda: any("Could not write" in t for t in texts(tg, PRIVATE)))
        assert notes(state) == []
        assert tool_results(llm.requests[1])[0] == AUTO_DENIED
        # the read-only tool ran; its question was declined, since nobody can answer in a cron run
        assert tool_results(llm.requests[2])[-1] == "not painted (decline)"


async def test_a_grant_no_longer_applies_once_the_server_changes_the_tool(store, llm, tg, tmp_path) -> None:
    async with running(store, config(llm, tg, tmp_path, trusted=True)) as gateway:
        await until_running(gateway)
        llm.tool_call("mcp__t__grow", {"size": 1}, id="g1")
        llm.reply("grew once")
        tg.private_message(PRIVATE, "grow")
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        first = prompt_message(tg, PRIVATE)
        old_grant = gateway.registry.get("mcp__t__grow").grant_key
        tg.press(PRIVATE, first.message_id, button(first, "Allow in this chat"), user_id=PRIVATE)
        await settle(gateway, lambda: "grew once" in texts(tg, PRIVATE))
        (bypass,) = await store.prompts.active_bypasses(f"telegram:{PRIVATE}:")
        assert bypass.tool == old_grant
        # the call changed the tool's schema and the server announced it: the gateway relists
        await gateway.mcp.wait_for(
            lambda m: (
                m.registry.get("mcp__t__grow") is not None and m.registry.get("mcp__t__grow").grant_key != old_grant
            ),
            10,
        )
        assert "unit" in gateway.registry.get("mcp__t__grow").parameters["properties"]

        llm.tool_call("mcp__t__grow", {"size": 2, "unit": "cm"}, id="g2")
        llm.reply("grew twice")
        tg.private_message(PRIVATE, "grow again")
        await settle(
            gateway, lambda: sum(1 for m in tg.bot_messages(PRIVATE) if m.buttons) == 1 and len(llm.requests) == 3
        )
        second = next(m for m in tg.bot_messages(PRIVATE) if m.buttons)
        assert second.message_id != first.message_id and "mcp__t__grow" in second.text  # asked again
        tg.press(PRIVATE, second.message_id, button(second, "Approve"), user_id=PRIVATE)
        await settle(gateway, lambda: "grew twice" in texts(tg, PRIVATE))
        assert tool_results(llm.requests[-1])[-1] == "grew 2cm"


async def test_an_elicitation_is_a_question_answered_by_button(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__confirm", {"item": "fence"}, id="c1")
    llm.responder = lambda request: Reply(f"result: {tool_results(request)[-1]}")
    async with running(store, config(llm, tg, tmp_path, trusted=True)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "paint the fence")
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        prompt = prompt_message(tg, PRIVATE)
        assert "t asks: Which colour?" in prompt.text
        assert [[b["text"] for b in row] for row in prompt.buttons] == [["red"], ["green"], ["blue"], ["Decline"]]
        run = (await store.runs.list())[0]
        assert run.stage == "AWAITING_INPUT"  # parked: the worker is free while the user thinks
        tg.press(PRIVATE, prompt.message_id, button(prompt, "green"), user_id=PRIVATE)
        await settle(gateway, lambda: any(t.startswith("result:") for t in texts(tg, PRIVATE)))
        assert texts(tg, PRIVATE)[-1] == "result: painted fence green"
        closed = tg.messages[PRIVATE][prompt.message_id]
        assert closed.buttons == [] and "Answered by Ann: green" in closed.text


async def test_an_elicitation_declined_by_button_tells_the_server(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__confirm", {"item": "fence"}, id="c1")
    llm.responder = lambda request: Reply(f"result: {tool_results(request)[-1]}")
    async with running(store, config(llm, tg, tmp_path, trusted=True)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "paint the fence")
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        prompt = prompt_message(tg, PRIVATE)
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Decline"), user_id=PRIVATE)
        await settle(gateway, lambda: any(t.startswith("result:") for t in texts(tg, PRIVATE)))
        assert texts(tg, PRIVATE)[-1] == "result: not painted (decline)"


async def test_a_server_crash_mid_call_is_a_tool_error_and_the_server_comes_back(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__crash", {}, id="x1")
    llm.reply("It crashed.")
    async with running(store, config(llm, tg, tmp_path, trusted=True)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "crash it")
        await settle(gateway, lambda: "It crashed." in texts(tg, PRIVATE))
        (result,) = tool_results(llm.requests[1])
        assert "stopped during the call" in result and "'t'" in result
        await gateway.mcp.wait_for(lambda m: m.states["t"].restarts >= 1 and m.states["t"].status == "running", 20)
        llm.tool_call("mcp__t__lookup", {"key": "again"}, id="l1")
        llm.reply("Back.")
        tg.private_message(PRIVATE, "look it up")
        await settle(gateway, lambda: "Back." in texts(tg, PRIVATE))
        assert tool_results(llm.requests[3])[-1] == "value of again"
        run = (await store.runs.list())[-1]
        statuses = [
            e.payload["status"]
            for r in await store.runs.list()
            for e in await store.runs.events(r.id)
            if e.kind == "MCP_CALL"
        ]
        assert sorted(statuses) == ["ok", "server_gone"] and run.stage == "SUCCESS"


async def test_errors_images_and_bad_arguments(store, llm, tg, tmp_path) -> None:
    llm.tool_calls(
        ("mcp__t__fail", {"reason": "testing"}, "f1"), ("mcp__t__chart", {}, "c1"), ("mcp__t__lookup", {"key": 3}, "l1")
    )
    llm.reply("done")
    async with running(store, config(llm, tg, tmp_path, trusted=True)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "try them")
        await settle(gateway, lambda: "done" in texts(tg, PRIVATE))
        failed, chart, bad = tool_results(llm.requests[1])
        assert "returned an error" in failed and "failed on purpose: testing" in failed
        assert chart.startswith("here is the chart\n[image/png saved to the workspace: mcp/t/")
        saved = chart.split("workspace: ")[1].split(" ")[0]
        assert session_file(tmp_path / "ws", saved).read_bytes().startswith(b"\x89PNG")
        assert "INVALID arguments for mcp__t__lookup" in bad and '"key" must be string' in bad
        calls = await store.sessions.open_tool_calls((await store.sessions.current(f"telegram:{PRIVATE}:")).id)
        assert calls == []
        assert json.loads(json.dumps(gateway.mcp.summary()))["t"]["tools"] == 10


async def test_status_shows_each_server(store, llm, tg, tmp_path) -> None:
    cfg = tg_config(
        llm,
        tg,
        tmp_path,
        mcp=mcp_section(t=stdio_server(tmp_path / "state"), broken={"command": ["/nonexistent/mcp-server"]}),
    )
    async with running(store, cfg) as gateway:
        await until_running(gateway)
        await gateway.mcp.wait_for(lambda m: m.states["broken"].status == "failed", 20)
        tg.private_message(PRIVATE, "/status")
        await settle(gateway, lambda: any("MCP" in t for t in texts(tg, PRIVATE)))
        status = texts(tg, PRIVATE)[-1]
        assert "MCP t: 🟢 running, 10 tools" in status
        assert "MCP broken: 🔴 down" in status


async def test_sampling_is_refused_unless_the_server_may_sample(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__haiku", {"topic": "autumn"}, id="h1")
    llm.reply("No poem.")
    async with running(store, config(llm, tg, tmp_path, trusted=True)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "a haiku please")
        await settle(gateway, lambda: "No poem." in texts(tg, PRIVATE))
        (result,) = tool_results(llm.requests[1])
        assert "asked to use the model (sampling), which is not enabled" in result
        assert len(llm.requests) == 2  # the model was not asked on the server's behalf


async def test_allowed_sampling_is_answered_by_the_model_and_counted_in_the_run(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__haiku", {"topic": "autumn"}, id="h1")
    llm.reply("leaves fall slowly", usage={"prompt_tokens": 30, "completion_tokens": 7})
    llm.reply("Here is your poem.")
    async with running(store, config(llm, tg, tmp_path, trusted=True, sampling=True)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "a haiku please")
        await settle(gateway, lambda: "Here is your poem." in texts(tg, PRIVATE))
        sampling_request = llm.requests[1]
        assert sampling_request["messages"] == [
            {"role": "system", "content": "You are a poet."},
            {"role": "user", "content": "Write a haiku about autumn."},
        ]
        assert tool_results(llm.requests[2]) == ["haiku: leaves fall slowly"]
        run = (await store.runs.list())[0]
        events = await store.runs.events(run.id)
        (sampled,) = [e.payload for e in events if e.kind == "MCP_SAMPLING"]
        assert sampled["server"] == "t" and sampled["output_chars"] == len("leaves fall slowly")
        assert run.llm_calls == 3 and run.output_tokens >= 7  # two turn rounds and the server's call
