"""Mid-call elicitation and sampling through Telegram: the test MCP server on an older protocol
(`protocol: legacy`, so it sends its questions and sampling as requests inside the call),
answered while the call waits: by button, declined, by typing, out of time; sampling answered
by our model and priced in the run, the session and the budgets; headless sessions decline;
a restart during the wait ends the call with a tool error. SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from fakes.llm import Reply
from helpers import until
from mcp_support import mcp_section, stdio_server, until_running
from test_budgets import priced
from test_telegram_e2e import (
    BOB,
    PRIVATE,
    answers,
    button,
    has_prompt,
    prompt_message,
    running,
    settle,
    texts,
    tg_config,
    tool_results,
)

from gateway.approvals.in_call import EXPIRED_QUESTION
from gateway.approvals.routing import NOT_ASKED
from gateway.budgets.caps import Caps, Payer

LEGACY = {"trusted": True, "protocol": "legacy"}


def config(llm, tg, tmp_path, *, questions: float | None = None, inbox: dict | None = None, **server):
    sections: dict = {"questions": {"timeout": questions}} if questions else {}
    if inbox:
        sections["inbox"] = inbox
    state = tmp_path / "state"
    mcp = mcp_section(t=stdio_server(state, **LEGACY, **server))
    mcp["servers"]["t"]["command"].append("--extra")
    return tg_config(llm, tg, tmp_path, mcp=mcp, **sections)


def results_reply(llm) -> None:  # noqa: ANN001
    llm.responder = lambda request: Reply(f"result: {tool_results(request)[-1]}")


def result_texts(tg) -> list[str]:  # noqa: ANN001
    return [t for t in texts(tg, PRIVATE) if t.startswith("result:")]


async def test_a_mid_call_question_is_answered_by_button_while_the_call_waits(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__confirm", {"item": "fence"}, id="c1")
    results_reply(llm)
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await until_running(gateway)
        assert gateway.mcp.summary()["t"]["protocol"] < "2026"
        tg.private_message(PRIVATE, "paint the fence")
        await until(lambda: has_prompt(tg, PRIVATE), 20)
        prompt = prompt_message(tg, PRIVATE)
        assert "t asks: Which colour?" in prompt.text
        assert [[b["text"] for b in row] for row in prompt.buttons] == [["red"], ["green"], ["blue"], ["Decline"]]
        (run,) = await store.runs.list()
        assert run.stage == "RUNNING"  # not parked: the call waits inside the server's request
        (call,) = await store.sessions.open_tool_calls(run.session_id)
        assert call.status == "running"
        tg.press(PRIVATE, prompt.message_id, button(prompt, "green"), user_id=BOB)  # not Ann's to answer
        await until(lambda: (NOT_ASKED, True) in answers(tg))
        tg.press(PRIVATE, prompt.message_id, button(prompt, "green"), user_id=PRIVATE)
        await settle(gateway, lambda: bool(result_texts(tg)))
        assert result_texts(tg) == ["result: painted fence green"]
        closed = tg.messages[PRIVATE][prompt.message_id]
        assert closed.buttons == [] and "Answered by Ann: green" in closed.text
        assert len(llm.requests) == 2  # one call, one answer: no resumed turn
        assert await store.inbox.count_pending() == 0  # and no resume item left behind
        (run,) = await store.runs.list()
        events = [e.kind for e in await store.runs.events(run.id)]
        assert "MCP_QUESTION" in events and "AWAITING_INPUT" not in events and run.stage == "SUCCESS"


async def test_a_mid_call_question_declined_by_button_tells_the_server(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__confirm", {"item": "fence"}, id="c1")
    results_reply(llm)
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "paint the fence")
        await until(lambda: has_prompt(tg, PRIVATE), 20)
        prompt = prompt_message(tg, PRIVATE)
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Decline"), user_id=PRIVATE)
        await settle(gateway, lambda: bool(result_texts(tg)))
        assert result_texts(tg) == ["result: not painted (decline)"]


async def test_a_mid_call_question_answered_by_typing(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__rename", {"item": "door"}, id="r1")
    results_reply(llm)
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "rename the door")
        await until(lambda: has_prompt(tg, PRIVATE), 20)
        prompt = prompt_message(tg, PRIVATE)
        assert "What should it be called?" in prompt.text
        assert [[b["text"] for b in row] for row in prompt.buttons] == [["Decline"]]
        tg.private_message(PRIVATE, "Front door")
        await settle(gateway, lambda: bool(result_texts(tg)))
        assert result_texts(tg) == ["result: renamed door to Front door"]
        assert len(llm.requests) == 2  # the typed answer answered the call; it is no new message


async def test_in_interrupt_mode_the_typed_answer_answers_and_does_not_interrupt(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__rename", {"item": "door"}, id="r1")
    results_reply(llm)
    async with running(store, config(llm, tg, tmp_path, inbox={"busy_mode": "interrupt"})) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "rename the door")
        await until(lambda: has_prompt(tg, PRIVATE), 20)
        tg.private_message(PRIVATE, "Side door")
        await settle(gateway, lambda: bool(result_texts(tg)))
        assert result_texts(tg) == ["result: renamed door to Side door"]
        (run,) = await store.runs.list()
        assert run.stage == "SUCCESS"


async def test_the_waiting_call_keeps_its_question_alive_past_a_lease(store, llm, tg, tmp_path) -> None:
    """The question's expiry follows the call (a lease's time ahead), so it outlives many leases
    while the call waits; the maintenance that expires due prompts leaves it alone."""
    llm.tool_call("mcp__t__confirm", {"item": "fence"}, id="c1")
    results_reply(llm)
    fast = {"lease_ttl_s": 1.0, "poll_interval_s": 0.1}
    cfg = config(llm, tg, tmp_path, inbox=fast)
    cfg = cfg.model_copy(update={"outbox": cfg.outbox.model_copy(update={"sweep_after_s": 0.2})})
    async with running(store, cfg) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "paint the fence")
        await until(lambda: has_prompt(tg, PRIVATE), 20)
        (asked,) = await store.prompts.pending()
        await asyncio.sleep(3)  # three leases
        (still,) = await store.prompts.pending()
        assert still.id == asked.id and still.expires_at > asked.expires_at
        prompt = prompt_message(tg, PRIVATE)
        tg.press(PRIVATE, prompt.message_id, button(prompt, "red"), user_id=PRIVATE)
        await settle(gateway, lambda: bool(result_texts(tg)))
        assert result_texts(tg) == ["result: painted fence red"]


async def test_a_mid_call_question_nobody_answers_ends_with_its_timeout(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__confirm", {"item": "fence"}, id="c1")
    results_reply(llm)
    async with running(store, config(llm, tg, tmp_path, questions=1.5)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "paint the fence")
        await until(lambda: has_prompt(tg, PRIVATE), 20)
        prompt = prompt_message(tg, PRIVATE)
        await settle(gateway, lambda: bool(result_texts(tg)))
        assert result_texts(tg) == ["result: not painted (cancel)"]
        closed = tg.messages[PRIVATE][prompt.message_id]
        assert closed.buttons == [] and "Expired" in closed.text
        tg.press(PRIVATE, prompt.message_id, button(prompt, "red"), user_id=PRIVATE)
        await until(lambda: (EXPIRED_QUESTION, True) in answers(tg))


async def test_a_url_mode_question_shows_the_page_with_done_and_decline(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__sign_in", {"service": "drive"}, id="s1")
    results_reply(llm)
    async with running(store, config(llm, tg, tmp_path)) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "sign me in")
        await until(lambda: has_prompt(tg, PRIVATE), 20)
        prompt = prompt_message(tg, PRIVATE)
        assert "Sign in to drive." in prompt.text and "https://auth.example/drive" in prompt.text
        (link,), (done,), (decline,) = prompt.buttons
        assert link == {"text": "Open", "url": "https://auth.example/drive"}
        assert (done["text"], decline["text"]) == ("Done", "Decline")
        tg.press(PRIVATE, prompt.message_id, done["callback_data"], user_id=PRIVATE)
        await settle(gateway, lambda: bool(result_texts(tg)))
        assert result_texts(tg) == ["result: sign-in accept"]


async def test_mid_call_sampling_is_answered_by_the_model_and_priced(store, llm, tg, tmp_path) -> None:
    cap = {"caps": [{"scope": "user", "period": "day", "usd": 100}]}
    cfg = priced(config(llm, tg, tmp_path, sampling=True).model_copy())
    cfg = cfg.model_copy(update={"budgets": cfg.budgets.model_validate(cap)})
    llm.tool_call("mcp__t__haiku", {"topic": "autumn"}, id="h1", usage={"prompt_tokens": 10, "completion_tokens": 2})
    llm.reply("leaves fall slowly", usage={"prompt_tokens": 300, "completion_tokens": 70})
    llm.reply("Here is your poem.", usage={"prompt_tokens": 10, "completion_tokens": 2})
    async with running(store, cfg) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "a haiku please")
        await settle(gateway, lambda: "Here is your poem." in texts(tg, PRIVATE))
        assert llm.requests[1]["messages"] == [
            {"role": "system", "content": "You are a poet."},
            {"role": "user", "content": "Write a haiku about autumn."},
        ]
        assert tool_results(llm.requests[2]) == ["haiku: leaves fall slowly"]
        (run,) = await store.runs.list()
        (sampled,) = [e.payload for e in await store.runs.events(run.id) if e.kind == "MCP_SAMPLING"]
        # $0.001 a token: the server's call costs 370 tokens = $0.37, the turn's two rounds 24 tokens
        assert sampled["cost_nano_usd"] == 370_000_000
        assert run.llm_calls == 3 and run.output_tokens == 74 and run.cost_nano_usd == 394_000_000
        totals = await store.runs.session_totals(run.session_id)
        assert totals["cost_nano_usd"] == 394_000_000 and totals["input_tokens"] == 320
        # the spend cap counted it for Ann (the call's context is her turn's, not the connection's)
        (applied,) = Caps(cfg).applied(Payer(user=f"telegram:{PRIVATE}"), datetime.now(UTC))
        counter = await store.budgets.counter(applied.key)
        assert counter is not None and counter.used_nano_usd == 394_000_000


async def test_a_scheduled_run_declines_the_mid_call_question(store, llm, tg, tmp_path) -> None:
    job = {"name": "nightly", "cron": "0 3 * * *", "prompt": "Paint it.", "deliver_to": f"telegram:{PRIVATE}"}
    cfg = config(llm, tg, tmp_path).model_copy()
    cfg = cfg.model_copy(update={"scheduler": cfg.scheduler.model_validate({"enabled": True, "jobs": [job]})})
    llm.tool_call("mcp__t__confirm", {"item": "fence"}, id="c1")
    llm.responder = lambda request: Reply(f"cron result: {tool_results(request)[-1]}")
    async with running(store, cfg) as gateway:
        await until_running(gateway)
        schedule = await store.schedules.by_name("nightly")
        await gateway.scheduler.fire(schedule.id, datetime.now(UTC))
        await settle(gateway, lambda: any("cron result:" in t for t in texts(tg, PRIVATE)))
        assert any("cron result: not painted (decline)" in t for t in texts(tg, PRIVATE))
        assert not has_prompt(tg, PRIVATE)  # nobody was asked
        assert await store.prompts.pending() == []


async def test_a_restart_during_the_wait_ends_the_call_with_a_tool_error(store, llm, tg, tmp_path) -> None:
    llm.tool_call("mcp__t__confirm", {"item": "fence"}, id="c1")
    llm.responder = lambda request: Reply(f"after restart: {tool_results(request)[-1]}")
    cfg = config(llm, tg, tmp_path)
    async with running(store, cfg) as gateway:
        await until_running(gateway)
        tg.private_message(PRIVATE, "paint the fence")
        await until(lambda: has_prompt(tg, PRIVATE), 20)
        prompt = prompt_message(tg, PRIVATE)
    # stopped while the call waited: the question is over, the turn is continued by the next start
    assert len(llm.requests) == 1
    async with running(store, cfg) as gateway:
        await until_running(gateway)
        await settle(gateway, lambda: any(t.startswith("after restart:") for t in texts(tg, PRIVATE)))
        (result,) = tool_results(llm.requests[-1])
        waited = "was waiting for the user's answer to its question ('Which colour?') when the gateway restarted"
        assert waited in result
        assert "may or may not have taken effect" in result
        assert len(llm.requests) == 2  # the call was not run again: the model decides
        tg.press(PRIVATE, prompt.message_id, button(prompt, "green"), user_id=PRIVATE)  # a tap into the dead call
        await until(lambda: (EXPIRED_QUESTION, True) in answers(tg))
        assert await store.prompts.pending() == []
