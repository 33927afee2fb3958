"""The turn loop end to end: fake channel -> inbox -> turn -> fake LLM server -> store -> channel."""

from __future__ import annotations

import asyncio
import json

from harness import make_config, running_gateway
from helpers import session_file

from gateway.agent.guards import LENGTH_NOTICE, REPETITION_NOTICE, TOOL_LOOP_NOTICE
from gateway.agent.messages import placeholder_text


async def test_text_reply_is_sent_once_and_recorded(store, llm, tmp_path):
    llm.reply("Hello there!")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("hi")
        await h.idle()
        assert h.channel.messages() == ["Hello there!"]
        run = (await store.runs.list())[0]
        assert (run.stage, run.end_reason, run.llm_calls, run.rounds) == ("SUCCESS", "reply", 1, 1)
        kinds = [e.kind for e in await store.runs.events(run.id)]
        assert kinds == ["LLM_REQUEST", "LLM_RESPONSE"]
        history = await store.sessions.history(run.session_id)
        assert [(m.role, m.content) for m in history] == [("user", "hi"), ("assistant", "Hello there!")]


async def test_tool_round_runs_the_tool_and_links_its_event(store, llm, tmp_path):
    llm.tool_call("clock", {}, id="call_a")
    llm.reply("It is time.")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("what time is it?")
        await h.idle()
        assert h.channel.messages() == ["It is time."]
        second = llm.requests[1]["messages"]
        tool_messages = [m for m in second if m["role"] == "tool"]
        assert tool_messages and tool_messages[0]["tool_call_id"] == "call_a"
        run = (await store.runs.list())[0]
        events = await store.runs.events(run.id)
        tool_event = next(e for e in events if e.kind == "TOOL_CALL")
        asked_by = next(e for e in events if e.seq == tool_event.parent_seq)
        assert asked_by.kind == "LLM_RESPONSE" and asked_by.payload["tool_calls"][0]["id"] == "call_a"
        assert [e.seq for e in events] == sorted(e.seq for e in events)
        assert run.tool_calls == 1 and run.llm_calls == 2


async def test_reasoning_is_recorded_but_never_sent_back(store, llm, tmp_path):
    llm.tool_call("clock", {}, id="c1", reasoning="I should check the clock")
    llm.reasoning("the clock says noon", text="It is noon.")
    llm.reply("ok")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("think")
        await h.idle()
        await h.say("again")
        await h.idle()
        assert h.channel.messages() == ["It is noon.", "ok"]
        history = await store.sessions.history((await store.runs.list())[0].session_id)
        assert any(m.reasoning for m in history if m.role == "assistant")
        for request in llm.requests:
            for message in request["messages"]:
                assert "reasoning_content" not in message and "reasoning" not in message


async def test_invalid_arguments_are_answered_and_the_tool_is_not_run(store, llm, tmp_path):
    llm.tool_call("write_file", '{"path": "a.txt", "content": ', id="bad")  # malformed JSON
    llm.reply("sorry")
    config = make_config(
        llm.base_url, str(tmp_path / "ws"), approvals={"rules": [{"tool": "write_file", "action": "allow"}]}
    )
    async with running_gateway(store, config) as h:
        await h.say("write it")
        await h.idle()
    assert not session_file(tmp_path / "ws", "a.txt").exists()
    tool_message = next(m for m in llm.requests[1]["messages"] if m["role"] == "tool")
    assert "malformed JSON" in tool_message["content"] and "call write_file again" in tool_message["content"].lower()
    call = next(m for m in llm.requests[1]["messages"] if m.get("tool_calls"))["tool_calls"][0]
    import json

    assert isinstance(json.loads(call["function"]["arguments"]), dict)  # history stays well-formed


async def test_stop_mid_stream_cancels_the_request_and_leaves_paired_history(store, llm, tmp_path):
    llm.stall("thinking about it")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("long question")
        await asyncio.wait_for(llm.stalled.wait(), 20)
        await h.say("/stop")
        await asyncio.wait_for(llm.disconnected.wait(), 5)
        await h.idle()
        assert "Stopped." in h.channel.messages()
        run = (await store.runs.list())[0]
        assert (run.stage, run.end_reason) == ("CANCELED", "canceled")
        llm.reply("fresh answer")
        await h.say("next")
        await h.idle()
        assert h.channel.messages()[-1] == "fresh answer"


async def test_stop_mid_tool_kills_the_process_and_marks_the_call_cancelled(store, llm, tmp_path):
    llm.tool_call("shell", {"command": "sleep 30; touch finished"}, id="slow")
    config = make_config(
        llm.base_url, str(tmp_path / "ws"), approvals={"rules": [{"tool": "shell", "action": "allow"}]}
    )
    async with running_gateway(store, config) as h:
        await h.say("run it")
        session = None
        for _ in range(200):
            session = await store.sessions.current("fake:chat1:")
            if session and any(c.status == "running" for c in await store.sessions.open_tool_calls(session.id)):
                break
            await asyncio.sleep(0.02)
        await h.say("/stop")
        await h.idle()
        history = await store.sessions.history(session.id)
        call = history[-1].tool_calls[0]
        assert call.status == "cancelled" and call.result == placeholder_text("canceled")
    await asyncio.sleep(0.2)
    assert not session_file(tmp_path / "ws", "finished").exists()


async def test_repetition_is_cut_and_reprompted_then_ends_the_turn(store, llm, tmp_path):
    looping = "All work and no play makes the agent a dull bot. " * 40
    for _ in range(3):
        llm.reply(looping)
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("write")
        await h.idle()
        run = (await store.runs.list())[0]
        assert run.end_reason == "repetition"
        notices = [m for m in llm.requests[1]["messages"] if m["role"] == "user" and REPETITION_NOTICE in m["content"]]
        assert notices
        history = await store.sessions.history(run.session_id)
        assert all(len(m.content) < len(looping) for m in history if m.role == "assistant")


async def test_tool_loop_guard_ends_the_turn_at_ten_identical_rounds(store, llm, tmp_path):
    for i in range(12):
        llm.tool_call("scratchpad_get", {"key": "x"}, id=f"c{i}")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("poll")
        await h.idle()
        run = (await store.runs.list())[0]
        assert (run.end_reason, run.rounds) == ("tool_loop", 10)
        assert any("same tool calls" in m for m in h.channel.messages())
        notice_seen = [any(TOOL_LOOP_NOTICE in (m.get("content") or "") for m in r["messages"]) for r in llm.requests]
        assert notice_seen.index(True) == 5  # told after the fifth identical round


async def test_reply_cut_by_length_is_reprompted_twice_then_overflow(store, llm, tmp_path):
    for _ in range(3):
        llm.reply("part of an answer", finish_reason="length")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("long")
        await h.idle()
        run = (await store.runs.list())[0]
        assert (run.end_reason, run.rounds) == ("overflow", 3)
        assert any(LENGTH_NOTICE in m["content"] for m in llm.requests[2]["messages"] if m["role"] == "user")


async def test_costs_are_priced_in_nano_usd_and_unpriced_models_say_so(store, llm, tmp_path):
    llm.reply(
        "a",
        usage={
            "prompt_tokens": 1000,
            "completion_tokens": 100,
            "total_tokens": 1100,
            "prompt_tokens_details": {"cached_tokens": 400},
        },
    )
    priced = make_config(
        llm.base_url, str(tmp_path), llm={"prices": {"test-model": {"input": 1.0, "cached_input": 0.5, "output": 4.0}}}
    )
    async with running_gateway(store, priced) as h:
        await h.say("x")
        await h.idle()
    run = (await store.runs.list())[0]
    # 600 * 1.0 + 400 * 0.5 + 100 * 4.0 = 1200 USD per million tokens -> 0.0012 USD
    assert run.cost_nano_usd == 1_200_000 and not run.unpriced
    llm.reply("b")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("y")
        await h.idle()
    latest = (await store.runs.list())[0]
    assert latest.cost_nano_usd is None and latest.unpriced


async def test_a_trace_write_failure_does_not_fail_the_turn(sqlite_store, llm, tmp_path):
    from sqlalchemy import text

    await sqlite_store.db.write(lambda conn: conn.execute(text("DROP TABLE run_events")))
    llm.reply("still answered")
    async with running_gateway(sqlite_store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("hi")
        await h.idle()
        assert h.channel.messages() == ["still answered"]
    run = (await sqlite_store.runs.list())[0]
    assert run.stage == "SUCCESS"


async def test_llm_failure_retries_then_apologises_and_marks_the_request_failed(store, llm, tmp_path):
    for _ in range(4):
        llm.error(500)
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("hello?")
        await h.idle()
        assert any(m.startswith("Sorry, I couldn't finish that") for m in h.channel.messages())
        run = (await store.runs.list())[0]
        assert (run.stage, run.end_reason) == ("FAILED", "error")
        events = await store.runs.events(run.id)
        assert any(e.kind == "RUN_ERROR" for e in events)
        history = await store.sessions.history(run.session_id)
        assert history[-1].role == "user" and history[-1].status == "failed"
        llm.reply("back")
        await h.say("hello again")
        await h.idle()
        last_request = llm.requests[-1]["messages"]
        assert not any(m.get("content") == "hello?" for m in last_request)


async def test_compaction_is_recorded_on_the_run_and_shown_in_the_chat(store, llm, tmp_path):
    config = make_config(
        llm.base_url, str(tmp_path), llm={"context_window": 4000, "reserve_pct": 10},
        context={"headroom_tokens": 500, "keep_messages": 2, "keep_tool_exchanges": 1},
    )
    session = await store.sessions.open("fake:chat1:", source="fake", started_by="100")
    for i in range(40):
        await store.sessions.append(session.id, "user", f"question {i}: " + "tell me more " * 20)
        await store.sessions.append(session.id, "assistant", f"answer {i}: " + "here is more " * 20)
    from fakes.llm import Reply

    # The summariser's calls offer no tools; the turn's call does.
    llm.responder = lambda request: Reply(
        "Fresh answer." if request.get("tools") else "Summary of the earlier conversation."
    )
    async with running_gateway(store, config) as h:
        await h.say("and now?")
        await h.idle()
        assert any("Compacting" in m for m in h.channel.messages())
        assert h.channel.messages()[-1] == "Fresh answer."
    run = (await store.runs.list())[0]
    kinds = [e.kind for e in await store.runs.events(run.id)]
    assert "COMPACTION_STARTED" in kinds and "COMPACTION_FINISHED" in kinds
    final = [r for r in llm.requests if r.get("tools")][-1]["messages"]
    # the summary stands where the folded rows stood, after the unchanged system message
    assert "Summary of the earlier conversation" in final[1]["content"] and len(final) < 40
    assert "Summary" not in final[0]["content"]


async def test_scratchpad_notes_reach_the_context_in_the_next_round(store, llm, tmp_path):
    llm.tool_call("scratchpad_set", {"key": "plan", "value": "step one: buy milk"}, id="n1")
    llm.reply("Noted.")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("remember the plan")
        await h.idle()
    assert "buy milk" not in json.dumps(llm.requests[0]["messages"])
    # in the tail (the last message), never in the system message a note would rewrite mid-turn
    assert "buy milk" in llm.requests[1]["messages"][-1]["content"]
    assert llm.requests[1]["messages"][0] == llm.requests[0]["messages"][0]


async def test_a_context_too_long_refusal_shrinks_and_resends_once(store, llm, tmp_path):
    session = await store.sessions.open("fake:chat1:", source="fake", started_by="100")
    for i in range(30):
        await store.sessions.append(session.id, "user", f"old question {i} " + "words " * 60)
        await store.sessions.append(session.id, "assistant", f"old answer {i} " + "words " * 60)
    from fakes.llm import Reply

    llm.context_too_long(dialect="llamacpp", prompt_tokens=9000, n_ctx=4096)
    llm.responder = lambda request: Reply(
        "Answered after shrinking." if request.get("tools") else "Summary of old questions."
    )
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("new question")
        await h.idle()
        assert h.channel.messages()[-1] == "Answered after shrinking."
    turn_requests = [r["messages"] for r in llm.requests if r.get("tools")]  # the summariser's offer no tools
    first, resent = turn_requests[0], turn_requests[-1]
    assert len(turn_requests) == 2 and len(str(resent)) < len(str(first)) / 2
    run = (await store.runs.list())[0]
    assert run.stage == "SUCCESS"
    assert any(
        e.kind == "RUN_ERROR" and "context too long" in e.payload["message"] for e in await store.runs.events(run.id)
    )


async def test_a_second_context_refusal_ends_the_turn_with_overflow(store, llm, tmp_path):
    for dialect in ("openai", "vllm"):
        llm.context_too_long(dialect=dialect, prompt_tokens=9000, n_ctx=4096)
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("question")
        await h.idle()
        assert "no longer fits" in h.channel.messages()[-1]
    run = (await store.runs.list())[0]
    assert (run.stage, run.end_reason) == ("FAILED", "overflow")
    assert len(llm.requests) == 2

