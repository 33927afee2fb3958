"""The durable inbox: dedupe, order, concurrency, busy modes, commands."""

from __future__ import annotations

import asyncio
import time

import pytest
from fakes.llm import FakeLLM, Reply, user_texts
from harness import ALICE, make_config, running_gateway

from gateway.events import InboundMessage, ThreadKey
from gateway.inbox.inbox import event_item
from gateway.inbox.running import ThreadState, apply_poll

T1 = ThreadKey("fake", "chat1", "")
T2 = ThreadKey("fake", "chat2", "")


def echo_last_user(request: dict) -> Reply:
    users = user_texts(request)
    return Reply(f"echo: {users[-1].splitlines()[-1] if users else ''}")


@pytest.fixture
async def llm():
    async with FakeLLM(responder=echo_last_user) as server:
        yield server


async def test_duplicate_events_give_one_turn(store, llm, tmp_path):
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        first = await h.say("hello", event_id="tg:1:42")
        again = await h.say("hello", event_id="tg:1:42")
        await h.idle()
        assert (first.duplicate, again.duplicate) == (False, True)
        assert len(llm.requests) == 1
        assert h.channel.messages() == ["echo: hello"]


async def test_per_thread_order_is_arrival_order_and_each_turn_has_one_seed(store, llm, tmp_path):
    config = make_config(llm.base_url, str(tmp_path), inbox={"busy_mode": "queue"})
    async with running_gateway(store, config) as h:
        results = await asyncio.gather(*(h.say(f"m{i}") for i in range(10)))
        await h.idle()
        items = [await store.inbox.get_by_event(r.event_id) for r in results]
        arrival = [i.payload["text"] for i in sorted(items, key=lambda i: i.id)]
        assert h.channel.messages() == [f"echo: {text}" for text in arrival]
        assert len(await store.runs.list()) == 10


async def test_two_threads_run_at_the_same_time(store, tmp_path):
    async with FakeLLM() as llm:
        llm.stall("one")
        llm.stall("two")
        async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
            await h.say("a", thread=T1)
            await h.say("b", thread=T2)
            await h.wait_for(lambda: len(llm.requests) == 2)  # both LLM calls are open at once
            await h.say("/stop", thread=T1)
            await h.say("/stop", thread=T2)
            await h.idle()
            assert h.channel.messages(T1) == ["Stopped."] and h.channel.messages(T2) == ["Stopped."]


async def _busy_turn(h, llm, second: str) -> None:  # noqa: ANN001
    """Start a turn whose first round runs a slow tool, and send `second` while it runs."""
    await h.say("first")
    await h.wait_for(lambda: len(llm.requests) == 1)
    await asyncio.sleep(0.1)
    await h.say(second)
    await h.idle()


def _slow_tool_config(llm, tmp_path, mode):  # noqa: ANN001, ANN202
    return make_config(
        llm.base_url,
        str(tmp_path / "ws"),
        inbox={"busy_mode": mode},
        approvals={"rules": [{"tool": "shell", "action": "allow"}]},
    )


async def test_steer_appends_messages_at_the_next_round_boundary(store, tmp_path):
    async with FakeLLM(responder=echo_last_user) as llm:
        llm.tool_call("shell", {"command": "sleep 0.6"}, id="slow")
        async with running_gateway(store, _slow_tool_config(llm, tmp_path, "steer")) as h:
            await _busy_turn(h, llm, "also this")
            assert len(await store.runs.list()) == 1
            second_round = llm.requests[1]["messages"]
            assert second_round[-1]["role"] == "user" and user_texts(llm.requests[1])[-1] == "also this"
            assert h.channel.messages() == ["echo: also this"]


async def test_queue_runs_messages_sent_while_busy_as_the_next_turn(store, tmp_path):
    async with FakeLLM(responder=echo_last_user) as llm:
        llm.tool_call("shell", {"command": "sleep 0.6"}, id="slow")
        async with running_gateway(store, _slow_tool_config(llm, tmp_path, "queue")) as h:
            await _busy_turn(h, llm, "later")
            runs = await store.runs.list()
            assert len(runs) == 2 and all(r.stage == "SUCCESS" for r in runs)
            assert h.channel.messages() == ["echo: first", "echo: later"]


async def test_interrupt_cancels_the_running_turn(store, tmp_path):
    async with FakeLLM(responder=echo_last_user) as llm:
        llm.tool_call("shell", {"command": "sleep 5"}, id="slow")
        async with running_gateway(store, _slow_tool_config(llm, tmp_path, "interrupt")) as h:
            await _busy_turn(h, llm, "never mind")
            runs = sorted(await store.runs.list(), key=lambda r: r.id)
            assert [r.stage for r in runs] == ["CANCELED", "SUCCESS"]
            assert h.channel.messages()[-1] == "echo: never mind"


async def test_stop_drops_queued_messages(store, tmp_path):
    async with FakeLLM() as llm:
        llm.stall()
        config = make_config(llm.base_url, str(tmp_path), inbox={"busy_mode": "queue"})
        async with running_gateway(store, config) as h:
            await h.say("first")
            await asyncio.wait_for(llm.stalled.wait(), 20)
            queued = [await h.say(f"queued {n}") for n in (1, 2, 3)]
            await h.say("/stop")
            await h.idle()
            assert h.channel.messages() == ["Stopped."]
            assert len(llm.requests) == 1
            # Not one turn each, canceled: dropped before any of them ran, and recorded.
            (run,) = await store.runs.list()
            assert run.stage == "CANCELED"
            session = await store.sessions.current("fake:chat1:")
            users = [m.content for m in await store.sessions.history(session.id) if m.role == "user"]
            assert users == ["first"]
            items = [await store.inbox.get_by_event(r.event_id) for r in queued]
            assert {i.status for i in items} == {"dropped"} and {i.session_id for i in items} == {session.id}
            dropped = await store.inbox.dropped("fake:chat1:", session_id=session.id)
            assert [i.payload["text"] for i in dropped] == ["queued 1", "queued 2", "queued 3"]
            llm.reply("after the stop")
            await h.say("a new question")
            await h.idle()
            assert h.channel.messages()[-1] == "after the stop"


async def test_a_running_turn_hears_of_work_another_instance_queued(store, tmp_path):
    # Queued straight into the store, as another instance's submit is: nothing pokes this one,
    # so the dispatcher's poll is what tells the running turn (on PostgreSQL, NOTIFY as well).
    async with FakeLLM() as llm:
        llm.stall()
        config = make_config(llm.base_url, str(tmp_path), inbox={"poll_interval_s": 0.2})
        async with running_gateway(store, config) as h:
            await h.say("first")
            await asyncio.wait_for(llm.stalled.wait(), 20)
            stop = InboundMessage(T1, ALICE, "/stop", "elsewhere:1", message_id="901")
            await store.inbox.add([event_item(stop)])
            await h.idle()
            assert h.channel.messages() == ["Stopped."]
            assert [r.stage for r in await store.runs.list()] == ["CANCELED"]


async def test_a_threads_state_goes_with_its_worker(store, llm, tmp_path):
    # One state per thread ever seen would grow with every chat the gateway has talked to.
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        for n in range(5):
            await h.say(f"hello {n}", thread=ThreadKey("fake", f"chat{n}", ""))
        await h.idle()
        assert sorted(h.channel.messages(ThreadKey("fake", f"chat{n}", ""))[0] for n in range(5)) == [
            f"echo: hello {n}" for n in range(5)
        ]
        assert h.gateway.inbox.worker.runner.threads == {}
        await h.say("again", thread=T1)  # a thread worked before starts afresh and is answered
        await h.idle()
        assert h.channel.messages(T1)[-1] == "echo: again"
        assert h.gateway.inbox.worker.runner.threads == {}


def test_the_dispatchers_read_keeps_a_running_thread_known_quiet_or_wakes_it():
    quiet, busy, unknown = ThreadState(), ThreadState(), ThreadState()
    for state in (quiet, busy, unknown):
        state.found(state.pokes, others_pending=False)
        state.quiet = (state.pokes, time.monotonic() - 10)  # found quiet long ago
    threads = {"q": quiet, "b": busy, "u": unknown}
    read_at = time.monotonic()
    apply_poll(threads, {"q": 0, "b": 0}, read_at, ["b"], complete=True)
    assert quiet.known_quiet(1.0) and not busy.known_quiet(1.0) and busy.wake.is_set()
    assert not unknown.known_quiet(1.0)  # not in the read: left as it was
    stale = ThreadState()
    stale.found(0, others_pending=False)
    stale.quiet = (0, read_at - 10)
    threads["s"] = stale
    apply_poll(threads, {"s": 0}, read_at, ["x"] * 3, complete=False)  # cut by its limit: proves nothing
    assert not stale.known_quiet(1.0)
    stale.poke()  # queued here while the read ran: the read cannot vouch for it
    apply_poll(threads, {"s": 0}, read_at, [], complete=True)
    assert not stale.known_quiet(1.0)


async def test_sessions_show_lists_what_stop_dropped(sqlite_store, capsys):
    from gateway.cli.reports import print_session
    from gateway.store import NewItem

    session = await sqlite_store.sessions.open("fake:chat1:", source="fake")
    item = NewItem("e1", "fake:chat1:", "message", {"text": "never ran", "sender": {"name": "Ann"}})
    await sqlite_store.inbox.add([item])
    await sqlite_store.inbox.drop_pending("fake:chat1:", session_id=session.id)
    dropped = await sqlite_store.inbox.dropped("fake:chat1:", session_id=session.id)
    print_session(session, [], {}, dropped)
    out = capsys.readouterr().out
    assert "dropped unhandled by /stop: 1" in out and "Ann: never ran" in out


async def test_commands_are_answered_without_the_model(store, llm, tmp_path):
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("hello")
        await h.idle()
        for command in ("/help", "/status", "/cost", "/status@my_bot", "/frobnicate"):
            await h.say(command)
        await h.idle()
        help_reply, status, cost, status_at_bot, unknown = h.channel.messages()[1:]
        assert "/stop" in help_reply and "/new" in help_reply
        assert "idle" in status and "Queued messages: 0" in status and "input tokens" in status
        assert "output tokens" in cost
        assert "idle" in status_at_bot
        assert unknown.startswith("Unknown command /frobnicate") and "/help" in unknown
        assert len(llm.requests) == 1  # no command reached the model
        assert not any("/help" in m["content"] for r in llm.requests for m in r["messages"] if m["role"] == "user")


async def test_status_is_answered_while_a_turn_runs(store, tmp_path):
    async with FakeLLM() as llm:
        llm.stall()
        async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
            await h.say("work")
            await asyncio.wait_for(llm.stalled.wait(), 20)
            await h.say("/status")
            await h.wait_for(lambda: any("working" in m for m in h.channel.messages()))
            await h.say("/stop")
            await h.idle()


async def test_new_starts_a_fresh_session(store, llm, tmp_path):
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("remember the word apple")
        await h.idle()
        before = await store.sessions.current(str(T1))
        await h.say("/new")
        await h.say("what was the word?")
        await h.idle()
        after = await store.sessions.current(str(T1))
        assert after.id != before.id
        assert "Started a new session." in h.channel.messages()
        last = llm.requests[-1]["messages"]
        assert not any("apple" in (m.get("content") or "") for m in last)


async def test_submit_returns_only_after_commit_with_the_cursor(store, llm, tmp_path):
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        events = [InboundMessage(T1, ALICE, f"u{i}", f"tg:7:{i}") for i in range(3)]
        await h.gateway.submit(events, cursor=("telegram:offset", "3"))
        assert await store.inbox.load_cursor("telegram:offset") == "3"
        assert all([await store.inbox.get_by_event(e.event_id) for e in events])
        await h.idle()


async def test_compact_with_little_history_says_there_is_nothing_to_fold(store, llm, tmp_path):
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path))) as h:
        await h.say("hello")
        await h.idle()
        await h.say("/compact")
        await h.idle()
        assert h.channel.messages()[-1].startswith("Nothing to compact")
        assert len(llm.requests) == 1
