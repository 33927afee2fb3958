"""The conversation as Slack delivers it, end to end (signed events -> bolt -> gateway -> FakeLLM,
replies to FakeSlack), on SQLite and PostgreSQL: a thread the agent joins late, message_changed
(queued, running, answered), message_deleted (queued, answered), channel chatter kept as
context, and thumbs reactions recorded on the run."""

from __future__ import annotations

import asyncio
from typing import Any

from fakes.llm import FakeToolCall, Reply, user_texts
from helpers import echo
from test_slack_e2e import ANN, BOB, CHANNEL, DM, bot_messages, running, slack_config, texts

from gateway.serving.metrics import FEEDBACK
from gateway.store.conversation import DELETED_TEXT


def gated(llm: Any) -> tuple[asyncio.Event, asyncio.Event]:
    """The model's first answer waits for `go`; `started` is set when it was asked."""
    started, go = asyncio.Event(), asyncio.Event()

    async def script(body: dict[str, Any]) -> Reply:
        if len(llm.requests) == 1:
            started.set()
            await go.wait()
        return echo(body)

    llm.responder = script
    return started, go


async def stored(store: Any, event_id: str) -> Any:
    for _ in range(1000):
        item = await store.inbox.get_by_event(event_id)
        if item is not None:
            return item
        await asyncio.sleep(0.01)
    raise TimeoutError(event_id)


async def test_a_thread_joined_late_reaches_the_model_as_context(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        root = s.written(CHANNEL, BOB, "deploy failed on the db migration")
        aside = s.written(CHANNEL, ANN, "same here, on *staging*", root)
        await s.post(s.sender.message(CHANNEL, ANN, "same here, on *staging*", ts=aside, thread_ts=root))
        await s.mention("what broke?", thread_ts=root)
        await s.settle(lambda: bool(texts(slack)))
        await s.say_in_thread(root, "thanks")
        await s.settle(lambda: len(texts(slack)) == 2)
    said = user_texts(llm.requests[0])[-1]
    assert said == (
        "[earlier in this thread, before you were mentioned:\n"
        "Bob: deploy failed on the db migration\nAnn: same here, on *staging*]\nwhat broke?"
    )
    assert user_texts(llm.requests[1])[-1] == "thanks"  # a thread it is in: no context read again
    assert len(llm.requests) == 2


async def test_an_edit_of_a_queued_message_replaces_its_text(store, llm, slack, tmp_path) -> None:
    started, go = gated(llm)
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        await s.dm("first")
        await asyncio.wait_for(started.wait(), 10)
        queued = await s.dm("what is 2+3?")
        await stored(store, f"slack:{DM}:{queued['ts']}")
        edit = s.sender.changed(queued, "what is 2+2?", channel_type="im")
        await s.post(edit)
        go.set()
        await s.settle(lambda: len(texts(slack, DM)) == 2)
    assert len(llm.requests) == 2
    assert user_texts(llm.requests[1])[-1] == "what is 2+2?"
    assert texts(slack, DM) == ["re: first", "re: what is 2+2?"]


async def test_an_edit_while_its_turn_runs_joins_at_the_round_boundary(store, llm, slack, tmp_path) -> None:
    started, go = asyncio.Event(), asyncio.Event()

    async def script(body: dict[str, Any]) -> Reply:
        if len(llm.requests) == 1:
            started.set()
            await go.wait()
            return Reply("", tool_calls=(FakeToolCall("clock", {}, "c1"),))
        return echo(body)

    llm.responder = script
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        asked = await s.dm("book the room for 3pm")
        await asyncio.wait_for(started.wait(), 10)
        edit = s.sender.changed(asked, "book the room for 4pm", channel_type="im")
        await s.post(edit, event_id="EvEDIT1")
        await stored(store, "slack:event:EvEDIT1")
        go.set()
        await s.settle(lambda: bool(texts(slack, DM)))
    assert len(llm.requests) == 2
    said = user_texts(llm.requests[1])[-1]
    assert said.endswith("(edited) book the room for 4pm") and 'it said: "book the room for 3pm"' in said


async def test_an_edit_of_an_answered_mention_is_a_follow_up_once(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        mention = await s.mention("the meeting is on Tuesday")
        await s.settle(lambda: bool(texts(slack)))
        edit = s.sender.changed(mention | {"type": "message"}, "<@UBOT> the meeting is on Wednesday")
        await s.post(edit, event_id="EvEDIT2")
        await s.settle(lambda: len(texts(slack)) == 2)
        await s.post(edit, event_id="EvEDIT2")  # a retry of the same event
        unfurled = s.sender.changed(mention | {"type": "message"}, mention["text"])  # same text: no edit
        await s.post(unfurled)
        await s.gateway.inbox.wait_until_idle(10)
        replies = bot_messages(slack)
    assert len(llm.requests) == 2
    said = user_texts(llm.requests[1])[-1]
    assert said.endswith("(edited) the meeting is on Wednesday")
    assert 'already answered; it said: "the meeting is on Tuesday"' in said
    assert {m["thread_ts"] for m in replies} == {mention["ts"]}


async def test_on_edit_ignore_and_note(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    config = slack_config(llm, slack, tmp_path, inbox={"on_edit": "note"})
    async with running(store, config, slack) as s:
        asked = await s.dm("call me at 5")
        await s.settle(lambda: bool(texts(slack, DM)))
        await s.post(s.sender.changed(asked, "call me at 6", channel_type="im"), event_id="EvNOTE")
        await stored(store, "slack:event:EvNOTE")
        await s.gateway.inbox.wait_until_idle(10)
        assert len(llm.requests) == 1
        await s.dm("thanks")
        await s.settle(lambda: len(llm.requests) == 2)
    assert 'it said: "call me at 5", it now says: "call me at 6"' in user_texts(llm.requests[1])[-1]


async def test_a_deleted_queued_message_is_dropped(store, llm, slack, tmp_path) -> None:
    started, go = gated(llm)
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        await s.dm("first")
        await asyncio.wait_for(started.wait(), 10)
        queued = await s.dm("oops, not for you")
        await stored(store, f"slack:{DM}:{queued['ts']}")
        await s.post(s.sender.deleted(queued, channel_type="im"))
        go.set()
        await s.settle(lambda: bool(texts(slack, DM)))
        await asyncio.sleep(0.2)
        await s.gateway.inbox.wait_until_idle(10)
        item = await store.inbox.get_by_event(f"slack:{DM}:{queued['ts']}")
    assert len(llm.requests) == 1
    assert item is not None and item.status == "dropped" and item.payload.get("deleted")


async def test_a_deleted_answered_message_is_no_longer_seen_by_the_model(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        secret = await s.dm("my password is hunter2")
        await s.settle(lambda: bool(texts(slack, DM)))
        await s.post(s.sender.deleted(secret, channel_type="im"))
        await s.gateway.inbox.wait_until_idle(10)
        await s.dm("hello again")
        await s.settle(lambda: len(llm.requests) == 2)
    said = user_texts(llm.requests[1])
    assert said[0] == DELETED_TEXT and said[-1] == "hello again"
    assert not any("hunter2" in m.get("content", "") for m in llm.requests[1]["messages"] if m["role"] == "user")


async def test_channel_chatter_is_kept_as_context_for_the_next_mention(store, llm, slack, tmp_path) -> None:
    llm.responder = echo
    config = slack_config(llm, slack, tmp_path, {"channel_context": 5})
    async with running(store, config, slack) as s:
        for user, text in ((BOB, "lunch at noon?"), (ANN, "noon works")):
            event = s.sender.message(CHANNEL, user, text, ts=s.written(CHANNEL, user, text))
            await s.post(event)
            await stored(store, f"slack:{CHANNEL}:{event['ts']}")
        await s.gateway.inbox.wait_until_idle(10)
        assert llm.requests == []
        await s.mention("what did we decide?")
        await s.settle(lambda: bool(texts(slack)))
        await s.mention("and now?")
        await s.settle(lambda: len(texts(slack)) == 2)
    said = user_texts(llm.requests[0])[-1]
    assert said == (
        "[said in this chat since, not addressed to you:\nBob: lunch at noon?\nAnn: noon works]\nwhat did we decide?"
    )
    assert user_texts(llm.requests[1])[-1] == "and now?"


async def test_thumbs_on_a_reply_are_recorded_on_its_run(store, llm, slack, tmp_path) -> None:
    llm.reply("Here you go.")
    before = FEEDBACK.labels("slack", "down", "added")._value.get()
    async with running(store, slack_config(llm, slack, tmp_path), slack) as s:
        mention = await s.mention("help me")
        await s.settle(lambda: bool(texts(slack)))
        reply = bot_messages(slack)[-1]["ts"]
        await s.post(s.sender.reaction(CHANNEL, reply, ANN, "+1"))
        await s.post(s.sender.reaction(CHANNEL, reply, ANN, "+1", added=False))
        await s.post(s.sender.reaction(CHANNEL, reply, BOB, "thumbsdown::skin-tone-3"))
        await s.post(s.sender.reaction(CHANNEL, mention["ts"], BOB, "+1", item_user=ANN))  # not the agent's
        await s.post(s.sender.reaction(CHANNEL, reply, BOB, "tada"))
        await s.gateway.inbox.wait_until_idle(10)
        (run,) = await store.runs.list(limit=5)
        events = [e for e in await store.runs.events(run.id) if e.kind == "FEEDBACK"]
    assert [(e.payload["added"], e.payload["removed"], e.payload["by"]) for e in events] == [
        (["up"], [], ANN), ([], ["up"], ANN), (["down"], [], BOB)
    ]
    assert FEEDBACK.labels("slack", "down", "added")._value.get() == before + 1
    assert len(llm.requests) == 1
