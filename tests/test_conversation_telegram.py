"""The conversation as Telegram delivers it, end to end (FakeTelegram <- PTB <- gateway -> FakeLLM),
on SQLite and PostgreSQL: replies and quotes reach the model as context, edits (queued, running,
answered under each `inbox.on_edit`), an edited /stop, group chatter kept as context, and
thumbs reactions recorded on the run."""

from __future__ import annotations

import asyncio
import contextlib
import io
from typing import Any

import aiohttp
from admin_support import TOKEN, logged_in
from fakes.llm import FakeToolCall, Reply, user_texts
from fakes.telegram import BOT_ID, FakeTelegram
from helpers import echo
from test_telegram_e2e import GROUP, PRIVATE, running, settle, texts, tg_config

from gateway.cli.reports import print_run
from gateway.serving.metrics import FEEDBACK


def last_user(llm: Any) -> str:
    return user_texts(llm.requests[-1])[-1]


def bot_message_ids(tg: FakeTelegram, chat: int) -> list[int]:
    return [m.message_id for m in tg.bot_messages(chat) if m.text]


async def stored(gateway: Any, update: dict[str, Any]) -> None:
    """Wait until the gateway has stored this update."""
    event_id = f"tg:{BOT_ID}:{update['update_id']}"
    for _ in range(1000):
        if await gateway.store.inbox.get_by_event(event_id) is not None:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError(event_id)


# --- replies and quotes ------------------------------------------------------------------


async def test_a_reply_to_the_bot_carries_its_message_and_counts_as_addressed_in_a_group(
    store, llm, tg, tmp_path
) -> None:
    llm.responder = echo
    llm.reply("The build broke at step three, in the linker.")
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.group_message(GROUP, "@test_bot why is the build red?")
        await settle(gateway, lambda: bool(texts(tg, GROUP)))
        answer = bot_message_ids(tg, GROUP)[-1]
        tg.group_message(GROUP, "which linker?", reply_to=answer)  # no mention: a reply to the bot
        await settle(gateway, lambda: len(llm.requests) == 2)
    said = last_user(llm)
    assert '[replying to you (your own earlier message): "The build broke at step three, in the linker."]' in said
    assert said.endswith("which linker?")


async def test_a_quote_carries_only_the_quoted_part(store, llm, tg, tmp_path) -> None:
    llm.reply("Option A is cheap. Option B is fast but costs more.")
    llm.responder = echo
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "compare the options")
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        answer = bot_message_ids(tg, PRIVATE)[-1]
        tg.private_message(PRIVATE, "how much more?", reply_to=answer, quote="Option B is fast but costs more.")
        await settle(gateway, lambda: len(llm.requests) == 2)
    said = last_user(llm)
    assert '[quoting from you (your own earlier message): "Option B is fast but costs more."]' in said
    assert "Option A" not in said


async def test_a_long_replied_message_is_quoted_within_its_budget(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        first = tg.private_message(PRIVATE, "x" * 3000)
        await settle(gateway, lambda: len(llm.requests) == 1)
        tg.private_message(PRIVATE, "and this?", reply_to=first["message"]["message_id"])
        await settle(gateway, lambda: len(llm.requests) == 2)
    quoted = last_user(llm).split("\n")[0]
    assert quoted.startswith('[replying to Ann: "xxx') and len(quoted) < 560


# --- edits ---------------------------------------------------------------------------------


async def test_an_edit_of_a_queued_message_replaces_its_text(store, llm, tg, tmp_path) -> None:
    started, go = asyncio.Event(), asyncio.Event()

    async def script(body: dict[str, Any]) -> Reply:
        if len(llm.requests) == 1:  # the first turn holds the thread: the next message stays queued
            started.set()
            await go.wait()
        return echo(body)

    llm.responder = script
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "first")
        await asyncio.wait_for(started.wait(), 10)
        original = tg.private_message(PRIVATE, "what is 2+3?")
        await stored(gateway, original)
        await stored(gateway, tg.edit(PRIVATE, original["message"]["message_id"], "what is 2+2?"))
        go.set()
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 2)
        await asyncio.sleep(0.2)
        await gateway.inbox.wait_until_idle(10)
    assert len(llm.requests) == 2
    assert user_texts(llm.requests[1])[-1] == "what is 2+2?"
    assert texts(tg, PRIVATE) == ["re: first", "re: what is 2+2?"]


async def test_an_edit_while_its_turn_runs_joins_at_the_round_boundary(store, llm, tg, tmp_path) -> None:
    started, go = asyncio.Event(), asyncio.Event()

    async def script(body: dict[str, Any]) -> Reply:
        if len(llm.requests) == 1:
            started.set()
            await go.wait()
            return Reply("", tool_calls=(FakeToolCall("clock", {}, "c1"),))
        return echo(body)

    llm.responder = script
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        original = tg.private_message(PRIVATE, "book the room for 3pm")
        await asyncio.wait_for(started.wait(), 10)
        edit = tg.edit(PRIVATE, original["message"]["message_id"], "book the room for 4pm")
        await stored(gateway, edit)
        go.set()
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
    assert len(llm.requests) == 2  # one turn: the edit joined it
    said = user_texts(llm.requests[1])
    assert said[0] == "book the room for 3pm"
    assert said[-1].endswith("(edited) book the room for 4pm")
    assert 'it said: "book the room for 3pm"' in said[-1]


async def test_an_edit_of_an_answered_message_is_a_follow_up_about_it(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        original = tg.private_message(PRIVATE, "the meeting is on Tuesday")
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        edit = tg.edit(PRIVATE, original["message"]["message_id"], "the meeting is on Wednesday")
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 2)
        tg.enqueue(edit)  # Telegram redelivers the same update: nothing happens twice
        await asyncio.sleep(0.3)
        await gateway.inbox.wait_until_idle(10)
    assert len(llm.requests) == 2
    said = last_user(llm)
    assert 'which you already answered; it said: "the meeting is on Tuesday"' in said
    assert said.endswith("(edited) the meeting is on Wednesday")


async def test_on_edit_ignore_drops_an_answered_messages_edit(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    config = tg_config(llm, tg, tmp_path, inbox={"on_edit": "ignore"})
    async with running(store, config) as gateway:
        original = tg.private_message(PRIVATE, "call me at 5")
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        edit = tg.edit(PRIVATE, original["message"]["message_id"], "call me at 6")
        await stored(gateway, edit)
        await gateway.inbox.wait_until_idle(10)
        tg.private_message(PRIVATE, "thanks")
        await settle(gateway, lambda: len(llm.requests) == 2)
    assert [user_texts(r)[-1] for r in llm.requests] == ["call me at 5", "thanks"]


async def test_on_edit_note_keeps_the_edit_for_the_next_turn(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    config = tg_config(llm, tg, tmp_path, inbox={"on_edit": "note"})
    async with running(store, config) as gateway:
        original = tg.private_message(PRIVATE, "call me at 5")
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        edit = tg.edit(PRIVATE, original["message"]["message_id"], "call me at 6")
        await stored(gateway, edit)
        await gateway.inbox.wait_until_idle(10)
        assert len(llm.requests) == 1  # noted, not answered
        tg.private_message(PRIVATE, "thanks")
        await settle(gateway, lambda: len(llm.requests) == 2)
        tg.private_message(PRIVATE, "bye")
        await settle(gateway, lambda: len(llm.requests) == 3)
    noted = user_texts(llm.requests[1])[-1]
    assert 'Ann edited a message you had already answered; it said: "call me at 5", it now says: "call me at 6"' in (
        noted
    )
    assert noted.endswith("thanks")
    assert "call me at 6" not in user_texts(llm.requests[2])[-1]  # told once


async def test_an_edited_stop_is_not_replayed(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        stop = tg.private_message(PRIVATE, "/stop")
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        shown = len(texts(tg, PRIVATE))
        edit = tg.edit(PRIVATE, stop["message"]["message_id"], "/stop now")
        await stored(gateway, edit)
        again = tg.edit(PRIVATE, stop["message"]["message_id"], "hello")
        await stored(gateway, again)
        await asyncio.sleep(0.2)
        await gateway.inbox.wait_until_idle(10)
        assert len(texts(tg, PRIVATE)) == shown
        assert llm.requests == []
        item = await gateway.store.inbox.get_by_event(f"tg:{BOT_ID}:{again['update_id']}")
    assert item is not None and item.kind == "edit" and item.payload.get("ignored")


async def test_stop_drops_a_queued_edit_with_the_queued_messages(store, llm, tg, tmp_path) -> None:
    started, go = asyncio.Event(), asyncio.Event()

    async def script(body: dict[str, Any]) -> Reply:
        if len(llm.requests) == 2:
            started.set()
            await go.wait()
        return echo(body)

    llm.responder = script
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        answered = tg.private_message(PRIVATE, "call me at 5")
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        tg.private_message(PRIVATE, "and write it down")
        await asyncio.wait_for(started.wait(), 10)
        edit = tg.edit(PRIVATE, answered["message"]["message_id"], "call me at 6")
        await stored(gateway, edit)
        tg.private_message(PRIVATE, "/stop")
        item_id = f"tg:{BOT_ID}:{edit['update_id']}"
        for _ in range(1000):
            item = await gateway.store.inbox.get_by_event(item_id)
            if item is not None and item.status != "pending":
                break
            await asyncio.sleep(0.01)
        go.set()
        await asyncio.sleep(0.2)
        await gateway.inbox.wait_until_idle(10)
    assert item is not None and item.status == "dropped"
    assert len(llm.requests) == 2


# --- group context without a mention ------------------------------------------------------


async def test_group_chatter_is_kept_as_context_for_the_next_mention(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    config = tg_config(llm, tg, tmp_path, telegram={"group_context": 2})
    async with running(store, config) as gateway:
        tg.group_message(GROUP, "first, too old to keep", user_id=99, first_name="Bob")
        tg.group_message(GROUP, "lunch at noon?", user_id=99, first_name="Bob")
        await stored(gateway, tg.group_message(GROUP, "noon works", user_id=77, first_name="Cy"))
        await gateway.inbox.wait_until_idle(10)
        assert llm.requests == []  # chatter alone is never sent to the model
        tg.group_message(GROUP, "@test_bot what did they decide?")
        await settle(gateway, lambda: len(llm.requests) == 1)
        tg.group_message(GROUP, "@test_bot and now?")
        await settle(gateway, lambda: len(llm.requests) == 2)
    said = user_texts(llm.requests[0])[-1]
    assert "[said in this chat since, not addressed to you:\nBob: lunch at noon?\nCy: noon works]" in said
    assert "too old" not in said and said.endswith("what did they decide?")
    assert "lunch" not in user_texts(llm.requests[1])[-1]  # given once


async def test_without_group_context_chatter_is_not_stored(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        chatter = tg.group_message(GROUP, "lunch at noon?", user_id=99, first_name="Bob")
        tg.group_message(GROUP, "@test_bot hi")
        await settle(gateway, lambda: len(llm.requests) == 1)
        assert await gateway.store.inbox.get_by_event(f"tg:{BOT_ID}:{chatter['update_id']}") is None
    assert user_texts(llm.requests[0])[-1] == "hi"


# --- reactions -----------------------------------------------------------------------------


async def test_a_thumbs_reaction_on_a_reply_is_recorded_on_its_run(store, llm, tg, tmp_path) -> None:
    llm.reply("Here you go.")
    before = FEEDBACK.labels("telegram", "up", "added")._value.get()
    config = tg_config(llm, tg, tmp_path, admin={"token": TOKEN}, http={"host": "127.0.0.1", "port": 0})
    async with running(store, config, serve_http=True) as gateway:
        tg.private_message(PRIVATE, "help me")
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        answer = bot_message_ids(tg, PRIVATE)[-1]
        tg.react(PRIVATE, answer, ["👍"])
        tg.react(PRIVATE, answer, ["🔥"], ["👍"])  # taken back for another emoji
        tg.react(PRIVATE, answer, ["👎"], ["🔥"])
        (run,) = await gateway.store.runs.list(limit=5)
        await until_events(gateway, run.id, 3)
        await gateway.inbox.wait_until_idle(10)
        events = [e for e in await gateway.store.runs.events(run.id) if e.kind == "FEEDBACK"]
        assert gateway.http is not None
        base = f"http://127.0.0.1:{gateway.http.port}/admin"
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:  # an IP host
            await logged_in(http, base)
            async with http.get(f"{base}/runs/{run.id}") as response:
                page = await response.text()
    assert "0 👍 · 1 👎" in page and "👍 taken back by Ann" in page  # the console's run page
    assert f'<code id="run-trace">{run.trace_id}</code>' in page  # to find it in a tracing backend
    assert [(e.payload["added"], e.payload["removed"]) for e in events] == [(["up"], []), ([], ["up"]), (["down"], [])]
    assert FEEDBACK.labels("telegram", "up", "added")._value.get() == before + 1
    assert len(llm.requests) == 1  # nothing else happens
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        print_run(run, events)
    assert "feedback: 0 👍  1 👎" in shown.getvalue()


async def until_events(gateway: Any, run_id: int, count: int) -> None:
    for _ in range(1000):
        events = await gateway.store.runs.events(run_id)
        if len([e for e in events if e.kind == "FEEDBACK"]) >= count:
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("feedback not recorded")
