"""Approvals and clarifying questions through the inbox: park, tap, resume, on any instance."""

from __future__ import annotations

import json

from fakes.channel import FakeChannel
from fakes.llm import user_texts
from harness import BOB, make_config, running_gateway
from helpers import session_file, tool_results

from gateway.agent.tool_calls import NO_ANSWER, NO_ONE_TO_ASK
from gateway.approvals.policy import AUTO_DENIED
from gateway.approvals.prompts import NOT_PENDING, UNKNOWN_BUTTON
from gateway.approvals.routing import NOT_ASKED, OWN_REQUEST, REQUESTERS
from gateway.events import InboundMessage, Sender, ThreadKey, TurnEnded
from gateway.store import NewItem
from gateway.store.items import Verdict, resumed

T1 = ThreadKey("fake", "chat1", "")
T2 = ThreadKey("fake", "chat2", "")



def write_call(llm, name: str, text: str = "hi", call_id: str = "w1") -> None:  # noqa: ANN001
    llm.tool_call("write_file", {"path": name, "content": text}, id=call_id)


async def test_park_tap_resume(store, llm, tmp_path):
    write_call(llm, "note.txt")
    llm.reply("Written.")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("write a note")
        await h.idle()
        prompt = h.channel.prompts()[0]
        assert prompt.kind == "approval" and prompt.tool_name == "write_file" and '"note.txt"' in prompt.arguments
        run = (await store.runs.list())[0]
        assert run.stage == "AWAITING_INPUT"
        assert await store.inbox.lease_holder(f"thread:{T1}") is None  # the thread is released while parked
        assert not session_file(tmp_path / "ws", "note.txt").exists()
        answer = await h.tap(h.token(0, "✅"))
        assert not answer.alert and "Approved by Alice" in answer.answer
        await h.idle()
        assert session_file(tmp_path / "ws", "note.txt").read_text() == "hi"
        assert h.channel.messages()[-1] == "Written."
        assert any("✅ Approved by Alice" in text for text in h.channel.closes())
        run = await store.runs.get(run.id)
        assert (run.stage, run.end_reason) == ("SUCCESS", "reply")


async def test_deny_tells_the_model_and_a_typed_message_is_the_reason(store, llm, tmp_path):
    write_call(llm, "x.txt")
    llm.reply("Understood.")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("write x")
        await h.idle()
        await h.say("not that file, it is shared")
        await h.idle()
        assert "Waiting for a decision" in h.channel.messages()[-1]
        await h.tap(h.token(0, "❌"))
        await h.idle()
        assert not session_file(tmp_path / "ws", "x.txt").exists()
        assert tool_results(llm.requests[1]) == ["User rejected this tool call. Reason: not that file, it is shared"]
        assert any("❌ Denied by Alice" in text for text in h.channel.closes())
        assert len(llm.requests) == 2  # the reason was not also sent as a new turn


async def test_the_resume_item_carries_the_verdict_with_the_held_reason(store, llm, tmp_path):
    write_call(llm, "v.txt")
    llm.reply("Understood.")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("write v")
        await h.idle()
        await h.say("use another name")  # held, then the denial's reason
        await h.idle()
        await h.tap(h.token(0, "❌"))
        await h.idle()
    session = await store.sessions.current(str(T1))
    (call,) = (await store.sessions.history(session.id))[1].tool_calls
    prompt = await store.prompts.for_tool_call(call.id)
    item = await store.inbox.get_by_event(f"resume:{prompt.id}")
    verdict = resumed(item).verdict
    assert verdict == Verdict.of(prompt)
    assert (verdict.kind, verdict.status, verdict.decision) == ("approval", "rejected", "d")
    assert (verdict.answer, verdict.decided_by_name) == ("use another name", "Alice")


async def test_a_resume_item_written_before_items_carried_the_verdict_still_resumes(store, llm, tmp_path):
    write_call(llm, "old.txt")
    llm.reply("Written after all.")
    config = make_config(llm.base_url, str(tmp_path / "ws"))
    async with running_gateway(store, config) as first:
        await first.say("write old")
        await first.idle()
    (prompt,) = await store.prompts.pending(thread_key=str(T1))

    def old_shape(decided):  # noqa: ANN001, ANN202 - the payload of a resume item before the verdict
        return NewItem(f"resume:{decided.id}", decided.thread_key, "resume", {"prompt_id": decided.id})

    decided = await store.prompts.decide(
        prompt.id, status="approved", decision="a", decided_by="100", decided_by_name="Alice", resume=old_shape
    )
    assert decided.outcome == "decided"
    assert resumed(await store.inbox.get_by_event(f"resume:{prompt.id}")).verdict is None
    async with running_gateway(store, config) as second:
        await second.idle()
        assert session_file(tmp_path / "ws", "old.txt").read_text() == "hi"
        assert second.channel.messages()[-1] == "Written after all."
        assert any("✅ Approved by Alice" in text for text in second.channel.closes())


async def test_double_tap_and_foreign_tapper_change_nothing(store, llm, tmp_path):
    write_call(llm, "y.txt")
    llm.reply("ok")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("write y")
        await h.idle()
        approve = h.token(0, "✅")
        foreign = await h.tap(approve, sender=BOB)
        assert foreign.alert and foreign.answer == REQUESTERS
        assert (await store.prompts.pending(thread_key=str(T1)))  # still pending
        first = await h.tap(approve, event_id="fake:tap:first")
        redelivered = await h.tap(approve, event_id="fake:tap:first")
        second = await h.tap(h.token(0, "❌"))
        assert not first.alert and redelivered.duplicate
        assert second.alert and second.answer == NOT_PENDING
        await h.idle()
        assert session_file(tmp_path / "ws", "y.txt").exists()
        unknown = await h.tap("forged-token.a")
        assert unknown.alert and unknown.answer == UNKNOWN_BUTTON


async def test_configured_approvers_decide_instead_of_the_requester(store, llm, tmp_path):
    write_call(llm, "z.txt")
    llm.reply("ok")
    config = make_config(llm.base_url, str(tmp_path / "ws"), approvals={"approvers": {"fake": ["200"]}})
    async with running_gateway(store, config) as h:
        await h.say("write z")
        await h.idle()
        assert (await h.tap(h.token(0, "✅"))).answer == OWN_REQUEST  # Alice asked but is not an approver
        assert "Approved by Bob" in (await h.tap(h.token(0, "✅"), sender=BOB)).answer
        await h.idle()
        assert session_file(tmp_path / "ws", "z.txt").exists()


async def test_expiry_rejects_with_approval_expired(store, llm, tmp_path, clock):
    write_call(llm, "late.txt")
    llm.reply("It expired.")
    config = make_config(llm.base_url, str(tmp_path / "ws"), approvals={"expire_after": "1h"})
    async with running_gateway(store, config, clock=clock) as h:
        await h.say("write late")
        await h.idle()
        clock.advance(3599)
        assert await h.gateway.prompts.expire_due() == 0  # not yet
        clock.advance(1)
        tapped = await h.tap(h.token(0, "✅"))
        assert tapped.alert and "expired" in tapped.answer
        await h.idle()
        assert not session_file(tmp_path / "ws", "late.txt").exists()
        assert tool_results(llm.requests[1]) == ["User rejected this tool call. Reason: approval expired"]
        assert any("Expired" in text for text in h.channel.closes())


async def test_allow_for_15_minutes_covers_later_calls_in_the_thread_only(store, llm, tmp_path):
    write_call(llm, "a.txt", call_id="c1")
    llm.reply("first done")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("write a")
        await h.idle()
        await h.tap(h.token(0, "⏱"))
        await h.idle()
        write_call(llm, "b.txt", call_id="c2")
        llm.reply("second done")
        await h.say("write b")
        await h.idle()
        assert session_file(tmp_path / "ws", "b.txt").exists() and len(h.channel.prompts()) == 1
        write_call(llm, "c.txt", call_id="c3")
        await h.say("write c", thread=T2)
        await h.idle()
        assert len(h.channel.prompts(T2)) == 1 and not session_file(tmp_path / "ws", "c.txt").exists()


async def test_allow_in_this_chat_never_overrides_a_deny_rule(store, llm, tmp_path):
    rules = [{"tool": "write_file", "args": {"path": "secrets*"}, "action": "deny", "priority": 10}]
    write_call(llm, "a.txt", call_id="c1")
    llm.reply("ok")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"), approvals={"rules": rules})) as h:
        await h.say("write a")
        await h.idle()
        await h.tap(h.token(0, "🔁"))
        await h.idle()
        write_call(llm, "secrets.txt", call_id="c2")
        llm.reply("blocked")
        await h.say("now the secret one")
        await h.idle()
        assert not session_file(tmp_path / "ws", "secrets.txt").exists()
        assert "denied by approval policy" in tool_results(llm.requests[-1])[-1]
        assert len(h.channel.prompts()) == 1


async def test_deny_rule_hides_the_tool_from_the_model(store, llm, tmp_path):
    llm.reply("fine")
    config = make_config(llm.base_url, str(tmp_path / "ws"), approvals={"rules": [{"tool": "shell", "action": "deny"}]})
    async with running_gateway(store, config) as h:
        await h.say("hello")
        await h.idle()
    offered = {t["function"]["name"] for t in llm.requests[0]["tools"]}
    assert "shell" not in offered and "write_file" in offered


async def test_cron_session_auto_denies_and_the_tool_never_runs(store, llm, tmp_path):
    write_call(llm, "cron.txt")
    llm.reply("Could not write.")
    ended: list[TurnEnded] = []
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        async def listen(event: TurnEnded) -> None:
            ended.append(event)

        h.gateway.inbox.listeners.append(listen)
        thread = ThreadKey("cron", "nightly", "1")
        await store.sessions.open(
            str(thread), source="cron", kind="cron", interactive=False, ephemeral=True, fresh=True
        )
        await h.gateway.submit([InboundMessage(thread, Sender("scheduler", "scheduler"), "write the report", "job:1")])
        await h.idle()
    assert not session_file(tmp_path / "ws", "cron.txt").exists()
    assert tool_results(llm.requests[1]) == [AUTO_DENIED]
    assert not h.channel.prompts()
    assert ended[-1].auto_denied and ended[-1].auto_denied[0].startswith("write_file(")
    run = (await store.runs.list())[0]
    assert any(e.kind == "AUTO_DENIED" for e in await store.runs.events(run.id))
    history = await store.sessions.history(run.session_id)
    assert history[0].synthetic  # the scheduler's prompt is marked as such


async def test_question_answered_by_button(store, llm, tmp_path):
    llm.tool_call("ask_user", {"question": "Which colour?", "choices": ["red", "blue"]}, id="q1")
    llm.reply("Blue it is.")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("paint it")
        await h.idle()
        prompt = h.channel.prompts()[0]
        assert prompt.kind == "question" and [b.label for row in prompt.buttons for b in row] == ["red", "blue"]
        await h.tap(h.token(0, "blue"))
        await h.idle()
        assert tool_results(llm.requests[1]) == ["The user answered: blue"]
        assert h.channel.messages()[-1] == "Blue it is."


async def test_question_answered_by_typing_and_superseded_questions(store, llm, tmp_path):
    llm.tool_calls(("ask_user", {"question": "First?"}, "q1"), ("ask_user", {"question": "Second?"}, "q2"))
    llm.reply("Thanks.")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("ask me")
        await h.idle()
        await h.say("answer one")
        await h.idle()
        await h.say("answer two")
        await h.idle()
        assert tool_results(llm.requests[1]) == ["The user answered: answer one", "The user answered: answer two"]
        assert len(llm.requests) == 2  # typed answers did not start new turns


async def test_a_newer_question_supersedes_the_older_one(store, llm, tmp_path):
    llm.tool_call("ask_user", {"question": "Old?", "choices": ["a"]}, id="q1")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("first")
        await h.idle()
        old_token = h.token(0, "a")
        session = await store.sessions.current(str(T1))
        call = (await store.sessions.open_tool_calls(session.id))[0]
        await h.gateway.prompts.ask(
            session, T1, call, run_id=1, requested_by="100", question="New?", choices=["b"], allow_free_text=True
        )
        tapped = await h.tap(old_token)
        assert tapped.alert and tapped.answer == NOT_PENDING
        assert any("Superseded" in text for text in h.channel.closes())


async def test_question_timeout_and_non_interactive_answers(store, llm, tmp_path, clock):
    llm.tool_call("ask_user", {"question": "Anyone?"}, id="q1")
    llm.reply("No answer then.")
    config = make_config(llm.base_url, str(tmp_path), questions={"timeout": "10m"})
    async with running_gateway(store, config, clock=clock) as h:
        await h.say("ask")
        await h.idle()
        clock.advance(599)
        assert await h.gateway.prompts.expire_due() == 0  # not yet
        clock.advance(1)
        assert await h.gateway.prompts.expire_due() == 1
        await h.idle()
        assert tool_results(llm.requests[1]) == [NO_ANSWER]
        llm.tool_call("ask_user", {"question": "Cron?"}, id="q2")
        llm.reply("done")
        thread = ThreadKey("tick", "t", "1")
        await store.sessions.open(
            str(thread), source="tick", kind="tick", interactive=False, ephemeral=True, fresh=True
        )
        await h.gateway.submit([InboundMessage(thread, Sender("scheduler"), "check", "job:t1")])
        await h.idle()
        assert tool_results(llm.requests[-1]) == [NO_ONE_TO_ASK]


async def test_stop_while_waiting_cancels_the_prompt_and_the_turn(store, llm, tmp_path):
    write_call(llm, "never.txt")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("write")
        await h.idle()
        token = h.token(0, "✅")
        await h.say("/stop")
        await h.idle()
        assert (await h.tap(token)).answer == NOT_PENDING
        run = (await store.runs.list())[0]
        assert run.stage == "CANCELED"
        assert any("Canceled" in text for text in h.channel.closes())
        assert not session_file(tmp_path / "ws", "never.txt").exists()


async def test_restart_while_awaiting_approval_then_tap_resumes(store, llm, tmp_path):
    write_call(llm, "after.txt")
    llm.reply("Done after the restart.")
    config = make_config(llm.base_url, str(tmp_path / "ws"))
    async with running_gateway(store, config) as first:
        await first.say("write after")
        await first.idle()
        token = first.token(0, "✅")
    async with running_gateway(store, config) as second:  # a new gateway object, same database
        await second.tap(token)
        await second.idle()
        assert session_file(tmp_path / "ws", "after.txt").exists()
        assert second.channel.messages()[-1] == "Done after the restart."


async def test_restart_mid_tool_reruns_only_tools_without_side_effects(store, llm, tmp_path):
    """A worker died while two tools were running: clock (no side effects) and write_file."""
    from gateway.store import NewToolCall

    thread = str(T1)
    session = await store.sessions.open(thread, source="fake", started_by="100")
    await store.sessions.append(session.id, "user", "do both")
    run = await store.runs.start(session.id, thread)
    args = json.dumps({"path": "w.txt", "content": "x"})
    message = await store.sessions.append(
        session.id,
        "assistant",
        "",
        run_id=run.id,
        calls=[
            NewToolCall("c1", "clock", "{}", status="running"),
            NewToolCall("c2", "write_file", args, status="running"),
        ],
    )
    assert message.tool_calls
    llm.reply("Recovered.")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.idle()
        assert h.channel.messages() == ["Recovered."]
    history = await store.sessions.history(session.id)
    clock, write = history[1].tool_calls
    assert clock.status == "done" and "20" in clock.result  # re-run: it has a date
    assert write.status == "failed" and write.result == "interrupted by a restart; not re-run"
    old = await store.runs.get(run.id)
    assert (old.stage, old.error) == ("FAILED", "restart")
    assert any(e.kind == "RUN_ERROR" and e.payload["stage"] == "restart" for e in await store.runs.events(run.id))


async def test_new_while_an_approval_waits_keeps_the_held_message_for_the_new_session(store, llm, tmp_path):
    write_call(llm, "w.txt")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("write it")
        await h.idle()
        await h.say("actually, tell me a joke")  # held: an approval is pending
        await h.idle()
        llm.reply("Here is a joke.")
        await h.say("/new")
        await h.idle()
        assert h.channel.messages()[-1] == "Here is a joke."
        assert any("Canceled" in text for text in h.channel.closes())
        assert user_texts(llm.requests[-1]) == ["actually, tell me a joke"]



# --- who may decide: the same rule for buttons, typed answers, deny reasons and reruns ---


async def test_someone_else_cannot_answer_a_question_by_typing(store, llm, tmp_path):
    llm.tool_call("ask_user", {"question": "Which colour?"}, id="q1")
    llm.reply("Green it is.")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("paint it")
        await h.idle()
        await h.say("purple!", sender=BOB)  # another member of the group
        await h.idle()
        (question,) = await store.prompts.pending(thread_key=str(T1))
        assert question.status == "pending" and len(llm.requests) == 1
        assert "waiting for the person it was asked of" in h.channel.messages()[-1]
        await h.say("green")  # Alice, who asked
        await h.idle()
        assert tool_results(llm.requests[1]) == ["The user answered: green"]
        decided = await store.prompts.get(question.id)
        assert decided.decided_by == "100" and decided.answer == "green"
        # Bob's message was held, not lost: it comes after, as a turn of its own.
        assert any("purple!" in str(m["content"]) for m in llm.requests[-1]["messages"] if m["role"] == "user")


async def test_a_deny_reason_is_only_taken_from_the_person_who_denies(store, llm, tmp_path):
    write_call(llm, "x.txt")
    llm.reply("Understood.")
    llm.reply("Noted, Bob.")
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("write x")
        await h.idle()
        await h.say("do it, it's fine", sender=BOB)
        await h.idle()
        await h.tap(h.token(0, "❌"))  # Alice denies, without a reason of her own
        await h.idle()
        assert tool_results(llm.requests[1]) == ["User rejected this tool call."]


async def test_run_again_follows_the_rule_too(store, llm, tmp_path):
    chat = ThreadKey("telegram", "-500", "")
    job = {"name": "nightly", "cron": "0 3 * * *", "prompt": "Write the report.", "deliver_to": "telegram:-500"}
    config = make_config(llm.base_url, str(tmp_path / "ws"), scheduler={"enabled": True, "jobs": [job]})
    llm.reply("Hi Alice.")
    write_call(llm, "report.txt")
    llm.reply("Could not write it.")
    async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
        await h.say("hello", thread=chat)  # Alice's conversation in this chat
        await h.idle()
        from datetime import UTC, datetime

        schedule = await store.schedules.by_name("nightly")
        await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
        await h.idle()
        await h.wait_for(lambda: bool(h.channel.prompts(chat)))
        rerun = h.channel.prompts(chat)[0].buttons[0][0]
        refused = await h.tap(rerun.token, thread=chat, sender=BOB)
        assert refused.alert and refused.answer == NOT_ASKED
        assert (await store.prompts.by_token(rerun.token.split(".")[0])).status == "pending"
        llm.reply("Running it again.")
        allowed = await h.tap(rerun.token, thread=chat)  # Alice's conversation: hers to decide
        assert not allowed.alert
