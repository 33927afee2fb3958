"""`kill -9` of the instance running a turn, then another instance continues it (Telegram,
SQLite and PostgreSQL):

- with more messages waiting in the thread, the cut turn is continued before anything queued
  behind it, so each message is answered once, in order;
- a turn killed after asking for an approval, before it parked, parks in the run that
  continues it, and the tap resumes that run.
"""

from __future__ import annotations

import asyncio

import pytest
from fakes.llm import Reply, user_texts
from harness import make_config, running_gateway
from helpers import session_file, until
from test_subagents_crash import doomed_gateway, kill_9
from test_telegram_e2e import GROUP, PRIVATE, button, has_prompt, prompt_message, running, settle, texts, tg_config

from gateway.config import TracesConfig
from gateway.store import Fence, LeaseLost
from gateway.traces.runs import RunTrace


async def wait_for(check, timeout: float = 10.0) -> None:  # noqa: ANN001
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_reply_cut_by_kill_9_is_finished_before_the_message_queued_behind_it(store, llm, tg, tmp_path) -> None:
    """Answering the queued message first would leave the cut run to be continued after it,
    from a history whose newest message is the queued one: that one answered twice (the cut
    reply's message edited into a second answer to it) and the first never answered."""
    llm.stall("Answer to the first ques")
    config = tg_config(llm, tg, tmp_path, inbox={"lease_ttl_s": 3, "busy_mode": "queue"}, serve={"instance_id": "dies"})
    async with doomed_gateway("telegram", store, config, tmp_path) as (process, _port):
        tg.group_message(GROUP, "@test_bot first question")
        await asyncio.wait_for(llm.stalled.wait(), 30)

        async def partial_recorded() -> bool:
            runs = await store.runs.list()
            partial = await store.outbox.get(f"partial:{runs[0].id}") if runs else None
            return partial is not None and bool(partial.message_ids)

        await wait_for(partial_recorded)  # the cut reply shows in its own message
        tg.group_message(GROUP, "@test_bot second question")
        await wait_for(lambda: _pending_messages(store, 1))  # stored behind the running turn
        await kill_9(process)
    llm.responder = lambda request: Reply(f"Answer to the {user_texts(request)[-1].split()[-2]} question.")
    async with running(store, config, instance_id="survivor") as gateway:
        await settle(gateway, lambda: any("second" in t for t in texts(tg, GROUP)))
        await asyncio.sleep(0.3)  # a late second copy would show now
        assert texts(tg, GROUP) == ["Answer to the first question.", "Answer to the second question."]


async def _pending_messages(store, count: int) -> bool:  # noqa: ANN001
    return await store.inbox.count_pending(kinds=["message"]) == count


async def test_an_approval_asked_just_before_kill_9_resumes_the_run_that_continues_it(store, llm, tg, tmp_path) -> None:
    """The prompt was recorded by the killed run; the decision must resume the run parked on
    it now (the killed one is closed as FAILED), or the message is never answered."""
    llm.tool_call("write_file", {"path": "note.txt", "content": "hello"}, id="w1")
    llm.reply("Written.")
    tg.fail_next("sendMessage", "429", retry_after=5)  # the prompt waits: the turn has not parked
    config = tg_config(
        llm, tg, tmp_path, inbox={"lease_ttl_s": 3}, outbox={"sweep_after_s": 1}, serve={"instance_id": "dies"}
    )
    async with doomed_gateway("telegram", store, config, tmp_path) as (process, _port):
        tg.private_message(PRIVATE, "write a note")

        async def prompt_waits() -> bool:
            row = await store.outbox.get("prompt:1")
            return row is not None and bool(row.error)

        await wait_for(prompt_waits, 30)
        (run,) = await store.runs.list()
        assert run.stage == "RUNNING"
        await kill_9(process)
    async with running(store, config, instance_id="survivor") as gateway:
        await until(lambda: has_prompt(tg, PRIVATE), 30)  # swept once the platform's wait is over
        await gateway.inbox.wait_until_idle(10)
        prompt = prompt_message(tg, PRIVATE)
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
        await settle(gateway, lambda: "Written." in texts(tg, PRIVATE))
        assert session_file(tmp_path / "ws", "note.txt").read_text() == "hello"
        assert texts(tg, PRIVATE).count("Written.") == 1
        # The resumed run has none of its own rows before the call: still, the turn's request is
        # the user's message (not an unanswered row to drop from the context).
        assert user_texts(llm.requests[-1])[-1] == "write a note"
        assert all(m.status == "ok" for m in await store.sessions.history((await store.runs.list())[0].session_id))


async def test_a_turn_that_lost_its_thread_does_not_write_its_end(store) -> None:
    """A turn parking on an approval while another instance takes its thread over (its lease
    expired under load): its stage stays RUNNING for the new holder to continue. Written as
    AWAITING_INPUT, it would hide the run from that continuation, while the tap's resume, taken
    by the new holder before the park, found it still running and was dropped: stuck for good."""
    thread = "telegram:42:"
    session = await store.sessions.open(thread, source="telegram")
    run = await store.runs.start(session.id, thread)
    old = await store.inbox.acquire(f"thread:{thread}", "a", 30)
    await store.inbox.release(old)  # as when it expired and was taken over
    await store.inbox.acquire(f"thread:{thread}", "b", 30)
    trace = RunTrace(store, run.id, config=TracesConfig(), prices={}, fence=Fence(old.name, old.owner, old.fence))

    with pytest.raises(LeaseLost):
        await trace.end("AWAITING_INPUT", end_reason="awaiting_input")
    assert (await store.runs.get(run.id)).stage == "RUNNING"


async def test_a_cut_run_is_closed_and_its_continuation_started_in_one_write(store) -> None:
    """Killed again between the two, the turn was lost: the old run FAILED, no new one."""
    thread = "telegram:42:"
    session = await store.sessions.open(thread, source="telegram")
    cut = await store.runs.start(session.id, thread)
    lease = await store.inbox.acquire(f"thread:{thread}", "b", 30)
    stale = Fence(lease.name, "a", lease.fence)

    with pytest.raises(LeaseLost):
        await store.runs.continue_in_new_run(cut.id, "restart", fence=stale)
    assert [r.stage for r in await store.runs.list()] == ["RUNNING"]
    new = await store.runs.continue_in_new_run(cut.id, "restart", fence=Fence(lease.name, lease.owner, lease.fence))

    assert new is not None and new.stage == "RUNNING" and new.session_id == session.id
    old = await store.runs.get(cut.id)
    assert (old.stage, old.error) == ("FAILED", "restart")
    assert [e.kind for e in await store.runs.events(cut.id)] == ["RUN_ERROR"]
    assert await store.runs.continue_in_new_run(cut.id, "restart") is None  # continued once


async def test_a_decided_prompts_resume_stays_queued_until_its_run_is_under_way(store, llm, tmp_path) -> None:
    """Marked done before acting on it, a kill -9 in between lost it: the run parked for good
    with its prompt decided. Done after, the next holder of the thread finds it still queued."""
    llm.tool_call("write_file", {"path": "a.txt", "content": "a"}, id="w1")
    llm.stall("Writ")  # the resumed turn is mid-call: its worker could die now
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("write it")
        await h.idle()
        assert not (await h.tap(h.token(0, "✅"))).alert
        await asyncio.wait_for(llm.stalled.wait(), 10)
        assert await store.inbox.count_pending(kinds=["resume"]) == 1
        (run,) = await store.runs.list()
        assert run.stage == "RUNNING"  # reopened: a new holder continues it (and then drops the item)


async def test_a_run_left_running_again_after_its_continuation_gets_a_new_continue_item(store, llm, tmp_path):
    """Continued once (its item done), resumed later and killed again: still RUNNING, it must be
    queued again; a duplicate of the old item's id was ignored and the run waited for good."""
    from gateway.store.items import ContinueRun

    thread = "fake:chat9:"
    session = await store.sessions.open(thread, source="fake")
    run = await store.runs.start(session.id, thread)
    await store.inbox.add([ContinueRun(run.id).item(thread)])
    (old,) = await store.inbox.pending(thread)
    await store.inbox.finish([old.id])  # handled before (the run was parked then)

    assert await store.inbox.add_continuation(ContinueRun(run.id).item(thread), run.id)
    assert not await store.inbox.add_continuation(ContinueRun(run.id).item(thread), run.id)  # one waits
    (queued,) = await store.inbox.pending(thread)
    assert queued.payload == {"continue_run": run.id}


@pytest.mark.parametrize("chat", ["private", "group"])
async def test_a_send_cut_by_kill_9_while_telegram_was_slow_to_answer_is_listed_uncertain(
    store, llm, tg, tmp_path, chat
) -> None:
    """Killed while the Bot API carried out a new message but had not answered yet (the reply,
    or in a group the stream's first message): nothing of the outcome was written. The run
    that continues sends it again, once, and the outbox lists it as possibly a second copy, so
    a duplicate is always one `gateway outbox` shows."""
    target = PRIVATE if chat == "private" else GROUP
    if chat == "private":
        llm.reply("The answer, delivered while the process died.")
    else:
        llm.stall("The answer, streamed while the process ")
    tg.timeout_delay_s = 8  # carried out, then no answer for longer than the kill takes
    tg.fail_next("sendMessage", "timeout")
    config = tg_config(llm, tg, tmp_path, inbox={"lease_ttl_s": 3}, serve={"instance_id": "dies"})
    async with doomed_gateway("telegram", store, config, tmp_path) as (process, _port):
        if chat == "private":
            tg.private_message(PRIVATE, "a question")
        else:
            tg.group_message(GROUP, "@test_bot a question")
        await until(lambda: bool(tg.calls_to("sendMessage")), 30)
        await kill_9(process)
    llm.reply("The answer, delivered while the process died.")
    async with running(store, config, instance_id="survivor") as gateway:
        await settle(gateway, lambda: len(texts(tg, target)) >= 2)
        await asyncio.sleep(0.3)
    listed = await store.outbox.uncertain()
    assert len(texts(tg, target)) == 2  # the cut send and its one resend
    assert [r.thread_key for r in listed] == [f"telegram:{target}:"]
    assert listed[0].uncertain  # what may be in the chat twice, and why
