"""Telegram end to end: FakeTelegram <- real PTB <- TelegramChannel <- Gateway -> FakeLLM.

Every test runs the whole gateway (leader polling or the webhook, inbox, turns, prompts,
outbox) against the fake Bot API and the scripted LLM server, on SQLite and PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
from collections.abc import AsyncIterator, Callable
from datetime import UTC
from typing import Any

import aiohttp
import pytest
from fakes.llm import FakeLLM, Reply, user_texts
from fakes.telegram import BOT_ID, FakeTelegram, StoredMessage, utf16_len
from harness import make_config
from helpers import echo, every_api, session_file, tool_results, until

from gateway.app import Gateway
from gateway.approvals.policy import rejection_text
from gateway.approvals.routing import REQUESTERS
from gateway.config import Config
from gateway.events import InboundMessage, Sender, ThreadKey
from gateway.llm import LLMClient
from gateway.running.clock import SYSTEM_CLOCK, Clock
from gateway.store import Store

PRIVATE = 42  # Ann's private chat (her user id)
GROUP = -100200300
OTHER_PRIVATE = 45  # Bob's private chat
BOB = 99
UNPACED = {"rate_overall_per_s": 0, "rate_private_per_s": 0, "rate_group_per_min": 0}
SECRET = "e2e-secret_1"



def tg_config(
    llm: FakeLLM,
    tg: FakeTelegram,
    tmp_path,
    telegram: dict[str, Any] | None = None,
    llm_settings: dict[str, Any] | None = None,
    **sections: Any,
) -> Config:
    settings = {
        "token": tg.token, "api_base_url": tg.base_url, "poll_timeout_s": 1, "edit_interval_s": 0, "typing_after_s": 0,
        **UNPACED,
    }
    sections = {"serve": {"shutdown_grace": 2}, "http": {"port": 0}, **sections}
    sections = {**sections, "llm": {**llm.settings, **(llm_settings or {})}}
    return make_config(llm.base_url, str(tmp_path / "ws"), telegram={**settings, **(telegram or {})}, **sections)


@contextlib.asynccontextmanager
async def running(
    store: Store,
    config: Config,
    *,
    serve_http: bool = False,
    instance_id: str | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> AsyncIterator[Gateway]:
    """The whole gateway, with the Telegram channel built from `config.telegram`."""
    llm = LLMClient(config.llm, backoff_base_s=0.01)
    gateway = Gateway(config, store=store, llm=llm, serve_http=serve_http, instance_id=instance_id, clock=clock)
    gateway.channels["telegram"].poll_backoff_s = 0.05  # type: ignore[attr-defined]
    await gateway.start()
    try:
        yield gateway
    finally:
        await gateway.stop()


async def settle(gateway: Gateway, condition: Callable[[], bool]) -> None:
    """Wait for something visible in the fake, then for the gateway to have nothing left to do."""
    await until(condition)
    await gateway.inbox.wait_until_idle(10)


def texts(tg: FakeTelegram, chat: int) -> list[str]:
    return [m.text for m in tg.bot_messages(chat) if m.text]


def sent_to(tg: FakeTelegram, chat: int, method: str = "sendMessage") -> list[dict[str, Any]]:
    return [c.params for c in tg.calls_to(method) if int(c.params["chat_id"]) == chat]


def prompt_message(tg: FakeTelegram, chat: int) -> StoredMessage:
    """A snapshot of the prompt as first shown (the fake edits its own copy in place)."""
    return copy.deepcopy(
        next(m for m in tg.bot_messages(chat) if m.buttons or "Approval required" in m.text or m.text.startswith("❓"))
    )


def button(message: StoredMessage, label: str) -> str:
    for row in message.buttons:
        for b in row:
            if label in b["text"]:
                return b["callback_data"]
    raise KeyError(label)


def has_prompt(tg: FakeTelegram, chat: int) -> bool:
    return any(m.buttons for m in tg.bot_messages(chat))


def answers(tg: FakeTelegram) -> list[tuple[str, bool]]:
    """(text, show_alert) of every answerCallbackQuery, in order."""
    return [
        (c.params.get("text", ""), str(c.params.get("show_alert", "")).lower() == "true")
        for c in tg.calls_to("answerCallbackQuery")
    ]


def last_user_text(request: dict[str, Any]) -> str:
    return user_texts(request)[-1]


# --- replies -------------------------------------------------------------------------


@every_api
async def test_private_chat_reply_arrives_once(store, llm, tg, tmp_path, caplog) -> None:
    for logger in ("telegram", "httpx"):  # the most talkative levels, where URLs are logged
        caplog.set_level(logging.DEBUG, logger=logger)
    llm.reply("Hello **there**")
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "hi")
        await settle(gateway, lambda: texts(tg, PRIVATE))
        assert texts(tg, PRIVATE) == ["Hello there"]
        assert len(sent_to(tg, PRIVATE)) == 1
        final = tg.bot_messages(PRIVATE)[0]
        assert {"type": "bold", "offset": 6, "length": 5} in final.entities
        assert user_texts(llm.requests[0]) == ["hi"]
        assert await store.inbox.load_cursor("telegram:offset") == str(tg.calls_to("getUpdates")[-1].params["offset"])
    assert "<token>" in caplog.text and tg.token not in caplog.text  # Bot API URLs carry the token


async def test_group_answers_a_mention_and_ignores_the_rest(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.group_message(GROUP, "lunch anyone?")
        asked = tg.group_message(GROUP, "@test_bot what is 2+2?")
        await settle(gateway, lambda: texts(tg, GROUP))
        assert texts(tg, GROUP) == ["re: what is 2+2?"]
        assert len(llm.requests) == 1
        assert user_texts(llm.requests[0]) == ["what is 2+2?"]  # the unaddressed message never reached the model
        reply = tg.bot_messages(GROUP)[0]
        assert reply.reply_to == asked["message"]["message_id"]  # groups quote the question
        assert await store.inbox.count_pending() == 0


async def test_topics_are_separate_sessions_and_replies_stay_in_their_topic(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.topic_message(GROUP, 11, "@test_bot first topic")
        tg.topic_message(GROUP, 22, "@test_bot second topic")
        await settle(gateway, lambda: len(texts(tg, GROUP)) == 2)
        placed = {m.thread_id: m.text for m in tg.bot_messages(GROUP)}
        assert placed == {11: "re: first topic", 22: "re: second topic"}
        one = await store.sessions.current(f"telegram:{GROUP}:11")
        two = await store.sessions.current(f"telegram:{GROUP}:22")
        assert one is not None and two is not None and one.id != two.id
        for request in llm.requests:  # neither conversation saw the other
            assert len(user_texts(request)) == 1
        tg.topic_message(GROUP, 11, "@test_bot again")
        await settle(gateway, lambda: len(texts(tg, GROUP)) == 3)
        assert user_texts(llm.requests[-1]) == ["first topic", "again"]
        assert tg.bot_messages(GROUP)[-1].thread_id == 11



async def test_a_private_chats_topics_are_separate_sessions_answered_in_their_topic(store, llm, tg, tmp_path) -> None:
    """Topics in private chats (Bot API 9.3): each its own session; replies, drafts, typing
    and prompts go into the topic they answer, and a tap there decides."""
    llm.responder = echo
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "first topic", thread_id=3)
        tg.private_message(PRIVATE, "second topic", thread_id=4)
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 2)
        placed = {m.thread_id: m.text for m in tg.bot_messages(PRIVATE)}
        assert placed == {3: "re: first topic", 4: "re: second topic"}
        one = await store.sessions.current(f"telegram:{PRIVATE}:3")
        two = await store.sessions.current(f"telegram:{PRIVATE}:4")
        assert one is not None and two is not None and one.id != two.id
        assert await store.sessions.current(f"telegram:{PRIVATE}:") is None
        tg.private_message(PRIVATE, "again", thread_id=3)
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 3)
        assert user_texts(llm.requests[-1]) == ["first topic", "again"]
        assert tg.bot_messages(PRIVATE)[-1].thread_id == 3
        for method in ("sendMessage", "sendChatAction"):
            assert {c.get("message_thread_id") for c in sent_to(tg, PRIVATE, method)} == {"3", "4"}
        llm.responder = None
        prompt = await ask_for_write(gateway, llm, tg, thread_id=4)
        assert prompt.thread_id == 4
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
        await settle(gateway, lambda: "Written." in texts(tg, PRIVATE))
        assert tg.bot_messages(PRIVATE)[-1].thread_id == 4
        assert len(user_texts(llm.requests[-1])) == 2  # topic 4's own conversation


@pytest.mark.parametrize("topics", [True, False])
async def test_new_opens_a_topic_of_its_own_and_the_old_conversation_stays(store, llm, tg, tmp_path, topics) -> None:
    """`telegram.new_topic_per_conversation`: /new in a private chat opens a topic (Bot API 9.4),
    where a fresh session answers; the topic it was typed in keeps its conversation. A bot
    without topics starts over in the same thread, as /new always did."""
    llm.responder = echo
    tg.bot_settings["has_topics_enabled"] = topics
    config = tg_config(llm, tg, tmp_path, telegram={"new_topic_per_conversation": True})
    async with running(store, config) as gateway:
        tg.private_message(PRIVATE, "first words", thread_id=3 if topics else None)
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 1)
        tg.private_message(PRIVATE, "/new", thread_id=3 if topics else None)
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) >= 2 + int(topics))
        if not topics:
            assert texts(tg, PRIVATE)[-1] == "Started a new session." and not tg.calls_to("createForumTopic")
            return
        ((topic, name),) = tg.topics[PRIVATE].items()
        assert name.startswith("Chat of ")
        placed = [(m.thread_id, m.text) for m in tg.bot_messages(PRIVATE)[1:]]
        assert placed == [(topic, "A new conversation: what shall we talk about?"),
                          (3, "Started a new conversation in a topic of its own.")]
        tg.private_message(PRIVATE, "fresh start", thread_id=topic)
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 4)
        assert user_texts(llm.requests[-1]) == ["fresh start"]
        assert tg.bot_messages(PRIVATE)[-1].thread_id == topic
        tg.private_message(PRIVATE, "back here", thread_id=3)
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 5)
        assert user_texts(llm.requests[-1]) == ["first words", "back here"]  # the old topic kept its session


@pytest.mark.parametrize("shown", [True, False])
async def test_tool_progress_lines_follow_the_setting(store, llm, tg, tmp_path, shown) -> None:
    llm.tool_call("clock", {}, id="c1")
    llm.reply("It is late.")
    config = tg_config(llm, tg, tmp_path, telegram={"show_tool_progress": shown})
    async with running(store, config) as gateway:
        tg.private_message(PRIVATE, "what time is it?")
        await settle(gateway, lambda: "It is late." in texts(tg, PRIVATE))
        expected = ["🔧 clock {}", "It is late."] if shown else ["It is late."]
        assert texts(tg, PRIVATE) == expected


# --- approvals -----------------------------------------------------------------------


async def ask_for_write(
    gateway: Gateway, llm: FakeLLM, tg: FakeTelegram, chat: int = PRIVATE, **say: Any
) -> StoredMessage:
    """Ann asks for a file to be written; the model calls write_file; the prompt is shown."""
    llm.tool_call("write_file", {"path": "note.txt", "content": "hello"}, id="w1")
    llm.reply("Written.")
    if chat > 0:
        tg.private_message(chat, "write a note", **say)
    else:
        tg.group_message(chat, "@test_bot write a note", **say)
    await settle(gateway, lambda: has_prompt(tg, chat))
    return prompt_message(tg, chat)


@every_api
async def test_approve_button_runs_the_tool_and_closes_the_prompt(store, llm, tg, tmp_path) -> None:
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        prompt = await ask_for_write(gateway, llm, tg)
        assert "write_file" in prompt.text and '"path": "note.txt"' in prompt.text
        assert [[b["text"] for b in row] for row in prompt.buttons] == [
            ["✅ Approve", "❌ Deny"], ["⏱ Allow 15 min", "🔁 Allow in this chat"]]
        assert not session_file(tmp_path / "ws", "note.txt").exists()
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
        await settle(gateway, lambda: "Written." in texts(tg, PRIVATE))
        assert session_file(tmp_path / "ws", "note.txt").read_text() == "hello"
        closed = tg.messages[PRIVATE][prompt.message_id]
        assert closed.buttons == [] and "✅ Approved by Ann" in closed.text
        assert answers(tg) == [("✅ Approved by Ann", False)]
        assert "note.txt" in tool_results(llm.requests[1])[0]
        run = (await store.runs.list())[0]
        assert (run.stage, run.end_reason) == ("SUCCESS", "reply")


async def test_a_tap_reported_by_inline_message_id_approves(store, llm, tg, tmp_path) -> None:
    """Bot API 10.5 `callback_query_mode`: the tap names the prompt by inline_message_id and no
    chat; its token finds the prompt, the tool runs, and the prompt closes where it was asked."""
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        prompt = await ask_for_write(gateway, llm, tg)
        tg.inline_press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
        await settle(gateway, lambda: "Written." in texts(tg, PRIVATE))
        assert session_file(tmp_path / "ws", "note.txt").read_text() == "hello"
        closed = tg.messages[PRIVATE][prompt.message_id]
        assert closed.buttons == [] and "✅ Approved by Ann" in closed.text
        tg.inline_press(PRIVATE, prompt.message_id, button(prompt, "Deny"), user_id=PRIVATE)
        tg.inline_press(PRIVATE, prompt.message_id, "ap:forged.a", user_id=PRIVATE)
        await until(lambda: len(answers(tg)) == 3)
        await gateway.inbox.wait_until_idle(10)
        assert answers(tg) == [
            ("✅ Approved by Ann", False),
            ("This request is no longer pending.", True),
            ("This button is no longer valid.", True),
        ]
        assert len(llm.requests) == 2
        run = (await store.runs.list())[0]
        assert (run.stage, run.end_reason) == ("SUCCESS", "reply")


async def test_approval_buttons_say_what_they_do_and_none_is_left_to_tap(store, llm, tg, tmp_path) -> None:
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        prompt = await ask_for_write(gateway, llm, tg)
        styles = {b["text"]: b.get("style") for row in prompt.buttons for b in row}
        assert styles == {
            "✅ Approve": "success", "❌ Deny": "danger", "⏱ Allow 15 min": None, "🔁 Allow in this chat": None
        }
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Deny"), user_id=PRIVATE)
        await settle(gateway, lambda: "Written." in texts(tg, PRIVATE))
        assert [m.text.splitlines()[-1] for m in tg.bot_messages(PRIVATE) if m.message_id == prompt.message_id] == [
            "❌ Denied by Ann"
        ]
        assert not [m for m in tg.bot_messages(PRIVATE) if m.buttons]  # nothing left to tap


async def test_deny_button_skips_the_tool_and_tells_the_model(store, llm, tg, tmp_path) -> None:
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        prompt = await ask_for_write(gateway, llm, tg)
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Deny"), user_id=PRIVATE)
        await settle(gateway, lambda: "Written." in texts(tg, PRIVATE))
        assert not session_file(tmp_path / "ws", "note.txt").exists()
        closed = tg.messages[PRIVATE][prompt.message_id]
        assert closed.buttons == [] and "❌ Denied by Ann" in closed.text
        assert tool_results(llm.requests[1]) == [rejection_text(None)]


@pytest.mark.parametrize("label, lasts", [("Allow 15 min", "15 min"), ("Allow in this chat", "chat")])
async def test_allow_buttons_let_later_calls_run_without_asking(store, llm, tg, tmp_path, label, lasts) -> None:
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        llm.tool_call("shell", {"command": "echo first"}, id="s1")
        llm.reply("one")
        tg.private_message(PRIVATE, "run it")
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        prompt = prompt_message(tg, PRIVATE)
        tg.press(PRIVATE, prompt.message_id, button(prompt, label), user_id=PRIVATE)
        await settle(gateway, lambda: "one" in texts(tg, PRIVATE))
        assert "first" in tool_results(llm.requests[1])[0]

        llm.tool_call("shell", {"command": "echo second"}, id="s2")
        llm.reply("two")
        tg.private_message(PRIVATE, "run it again")
        await settle(gateway, lambda: "two" in texts(tg, PRIVATE))
        assert "second" in tool_results(llm.requests[3])[-1]
        asked = [m for m in tg.bot_messages(PRIVATE) if "Approval required" in m.text]
        assert len(asked) == 1  # the second call ran without a prompt
        (bypass,) = await store.prompts.active_bypasses(f"telegram:{PRIVATE}:")
        assert bypass.tool == "shell" and (bypass.expires_at is None) == (lasts == "chat")

        llm.tool_call("shell", {"command": "echo elsewhere"}, id="s3")
        tg.private_message(43, "run it here")  # another chat still asks
        await settle(gateway, lambda: has_prompt(tg, 43))


async def test_a_foreign_tap_is_refused_with_an_alert_and_changes_nothing(store, llm, tg, tmp_path) -> None:
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        prompt = await ask_for_write(gateway, llm, tg, chat=GROUP)
        tg.press(GROUP, prompt.message_id, button(prompt, "Approve"), user_id=BOB, first_name="Bob", username="bob")
        await until(lambda: len(answers(tg)) == 1)
        await gateway.inbox.wait_until_idle(10)
        assert answers(tg) == [(REQUESTERS, True)]  # who decides instead
        assert tg.messages[GROUP][prompt.message_id].buttons == prompt.buttons
        assert not session_file(tmp_path / "ws", "note.txt").exists() and len(llm.requests) == 1
        (pending,) = await store.prompts.pending(thread_key=f"telegram:{GROUP}:")
        assert pending.status == "pending"
        tg.press(GROUP, prompt.message_id, button(prompt, "Approve"))  # Ann, who asked, still can
        await settle(gateway, lambda: "Written." in texts(tg, GROUP))
        assert session_file(tmp_path / "ws", "note.txt").exists()


async def test_a_second_tap_is_told_the_request_is_no_longer_pending(store, llm, tg, tmp_path) -> None:
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        prompt = await ask_for_write(gateway, llm, tg)
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
        await settle(gateway, lambda: "Written." in texts(tg, PRIVATE))
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Deny"), user_id=PRIVATE)
        await until(lambda: len(answers(tg)) == 2)
        await gateway.inbox.wait_until_idle(10)
        assert answers(tg)[1] == ("This request is no longer pending.", True)
        assert session_file(tmp_path / "ws", "note.txt").exists() and len(llm.requests) == 2
        assert "Approved by Ann" in tg.messages[PRIVATE][prompt.message_id].text



async def test_a_message_typed_while_approval_waits_becomes_the_deny_reason(store, llm, tg, tmp_path) -> None:
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        prompt = await ask_for_write(gateway, llm, tg)
        tg.private_message(PRIVATE, "not in my home folder")
        await settle(gateway, lambda: any(t.startswith("⏳") for t in texts(tg, PRIVATE)))
        assert len(llm.requests) == 1  # held, not a new turn
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Deny"), user_id=PRIVATE)
        await settle(gateway, lambda: "Written." in texts(tg, PRIVATE))
        assert tool_results(llm.requests[1]) == [rejection_text("not in my home folder")]
        assert "Denied by Ann: not in my home folder" in tg.messages[PRIVATE][prompt.message_id].text
        assert len(llm.requests) == 2  # the reason was used up, not answered again


async def test_buttons_keep_working_after_a_restart(store, llm, tg, tmp_path) -> None:
    config = tg_config(llm, tg, tmp_path)
    async with running(store, config) as gateway:
        prompt = await ask_for_write(gateway, llm, tg)
    tg.press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
    async with running(store, config) as gateway:
        await settle(gateway, lambda: "Written." in texts(tg, PRIVATE))
        assert session_file(tmp_path / "ws", "note.txt").read_text() == "hello"
        assert "Approved by Ann" in tg.messages[PRIVATE][prompt.message_id].text
        assert tg.messages[PRIVATE][prompt.message_id].buttons == []
        assert texts(tg, PRIVATE).count("Written.") == 1


async def test_long_arguments_are_attached_and_the_prompt_still_closes(store, llm, tg, tmp_path) -> None:
    content = "\n".join(f"line {n}" for n in range(400))
    llm.tool_call("write_file", {"path": "big.txt", "content": content}, id="w2")
    llm.reply("Written.")
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "write a big file")
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        prompt = prompt_message(tg, PRIVATE)
        assert "more characters" in prompt.text
        (document,) = [m for m in tg.bot_messages(PRIVATE) if m.document]
        assert json.loads(document.document["content"]) == {"path": "big.txt", "content": content}
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
        await settle(gateway, lambda: "Written." in texts(tg, PRIVATE))
        assert session_file(tmp_path / "ws", "big.txt").read_text() == content
        assert tg.messages[PRIVATE][prompt.message_id].buttons == []



async def test_an_admin_may_decide_for_someone_else(store, llm, tg, tmp_path) -> None:
    config = tg_config(llm, tg, tmp_path, approvals={"admins": {"telegram": [BOB]}})
    async with running(store, config) as gateway:
        prompt = await ask_for_write(gateway, llm, tg, chat=GROUP)
        tg.press(GROUP, prompt.message_id, button(prompt, "Approve"), user_id=BOB, first_name="Bob", username="bob")
        await settle(gateway, lambda: "Written." in texts(tg, GROUP))
        assert "✅ Approved by Bob" in tg.messages[GROUP][prompt.message_id].text
        assert session_file(tmp_path / "ws", "note.txt").exists()


async def test_stop_cancels_a_pending_approval_and_its_buttons(store, llm, tg, tmp_path) -> None:
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        prompt = await ask_for_write(gateway, llm, tg)
        tg.private_message(PRIVATE, "/stop")
        await settle(gateway, lambda: "Stopped." in texts(tg, PRIVATE))
        closed = tg.messages[PRIVATE][prompt.message_id]
        assert closed.buttons == [] and "Canceled" in closed.text
        tg.press(PRIVATE, prompt.message_id, button(prompt, "Approve"), user_id=PRIVATE)
        await until(lambda: bool(answers(tg)))
        await gateway.inbox.wait_until_idle(10)
        assert answers(tg) == [("This request is no longer pending.", True)]
        assert not session_file(tmp_path / "ws", "note.txt").exists() and len(llm.requests) == 1
        run = (await store.runs.list())[0]
        assert run.stage == "CANCELED"


# --- questions -----------------------------------------------------------------------


async def ask_color(gateway: Gateway, llm: FakeLLM, tg: FakeTelegram) -> StoredMessage:
    llm.tool_call("ask_user", {"question": "Which colour?", "choices": ["red", "blue"]}, id="q1")
    llm.responder = lambda request: Reply(f"picked: {tool_results(request)[-1]}")
    tg.private_message(PRIVATE, "paint it")
    await settle(gateway, lambda: has_prompt(tg, PRIVATE))
    return prompt_message(tg, PRIVATE)


@every_api
async def test_question_answered_by_button(store, llm, tg, tmp_path) -> None:
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        prompt = await ask_color(gateway, llm, tg)
        assert "Which colour?" in prompt.text and [[b["text"] for b in row] for row in prompt.buttons] == [
            ["red"],
            ["blue"],
        ]
        tg.press(PRIVATE, prompt.message_id, button(prompt, "blue"), user_id=PRIVATE)
        await settle(gateway, lambda: any(t.startswith("picked") for t in texts(tg, PRIVATE)))
        assert texts(tg, PRIVATE)[-1] == "picked: The user answered: blue"
        closed = tg.messages[PRIVATE][prompt.message_id]
        assert closed.buttons == [] and "Answered by Ann: blue" in closed.text


async def test_question_answered_by_a_tap_reported_by_inline_message_id(store, llm, tg, tmp_path) -> None:
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        prompt = await ask_color(gateway, llm, tg)
        tg.inline_press(PRIVATE, prompt.message_id, button(prompt, "red"), user_id=PRIVATE)
        await settle(gateway, lambda: any(t.startswith("picked") for t in texts(tg, PRIVATE)))
        assert texts(tg, PRIVATE)[-1] == "picked: The user answered: red"
        closed = tg.messages[PRIVATE][prompt.message_id]
        assert closed.buttons == [] and "Answered by Ann: red" in closed.text


async def test_question_answered_by_typing(store, llm, tg, tmp_path) -> None:
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        prompt = await ask_color(gateway, llm, tg)
        tg.private_message(PRIVATE, "green, please")
        await settle(gateway, lambda: any(t.startswith("picked") for t in texts(tg, PRIVATE)))
        assert texts(tg, PRIVATE)[-1] == "picked: The user answered: green, please"
        assert len(llm.requests) == 2  # the typed answer resumed the turn; it started no other
        closed = tg.messages[PRIVATE][prompt.message_id]
        assert closed.buttons == [] and "Answered by Ann: green, please" in closed.text



async def test_commands_are_answered_without_the_model(store, llm, tg, tmp_path) -> None:
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.group_message(GROUP, "/help@test_bot")
        tg.group_message(GROUP, "/help@other_bot")  # addressed to another bot in the group
        await settle(gateway, lambda: bool(texts(tg, GROUP)))
        await until(lambda: not tg.pending_updates)
        await gateway.inbox.wait_until_idle(10)
        (reply,) = texts(tg, GROUP)
        assert reply.startswith("Commands:") and "/stop" in reply
        assert not llm.requests


@every_api
async def test_strangers_get_one_refusal_and_never_reach_the_model(store, llm, tg, tmp_path) -> None:
    config = tg_config(llm, tg, tmp_path, telegram={"allowed_users": [str(PRIVATE)]})
    # no access section (a written dm_policy would handle the others: tests/security/test_security_policy.py)
    config = config.model_copy(update={"access": type(config.access)()})
    async with running(store, config) as gateway:
        tg.private_message(43, "let me in")
        tg.private_message(43, "please")
        tg.group_message(GROUP, "@test_bot hi", user_id=44)
        await settle(gateway, lambda: bool(texts(tg, 43)))
        await until(lambda: not tg.pending_updates)
        await gateway.inbox.wait_until_idle(10)
        (refusal,) = texts(tg, 43)
        assert "Your Telegram id is 43" in refusal
        assert not texts(tg, GROUP) and not llm.requests
        assert await store.inbox.count_pending() == 0 and not await store.sessions.list()


async def test_a_long_reply_is_split_into_messages_telegram_accepts(store, llm, tg, tmp_path) -> None:
    paragraphs = [f"Paragraph {n}: " + " ".join(f"word{n}.{k}" for k in range(100)) for n in range(12)]
    llm.reply("\n\n".join(paragraphs))
    config = tg_config(llm, tg, tmp_path, telegram={"edit_interval_s": 0.3})
    async with running(store, config) as gateway:
        tg.group_message(GROUP, "@test_bot write an essay")
        await settle(gateway, lambda: texts(tg, GROUP)[-1:] != [] and texts(tg, GROUP)[-1].endswith("word11.99"))
        shown = texts(tg, GROUP)
        assert len(shown) == 3 and all(utf16_len(t) <= 4096 for t in shown)
        assert "\n\n".join(shown).split() == "\n\n".join(paragraphs).split()
        run = (await store.runs.list())[0]
        answer = [m for m in await store.sessions.history(run.session_id) if m.role == "assistant"][-1]
        record = await store.outbox.get(f"reply:{answer.id}")  # every message of the reply is recorded
        assert record is not None and record.message_ids == [str(m.message_id) for m in tg.bot_messages(GROUP)]


# --- no duplicates, nothing lost -----------------------------------------------------


async def test_the_same_update_delivered_twice_gets_one_reply(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    update = tg.message_update(PRIVATE, "only once")
    tg.enqueue(update)
    tg.enqueue(update)  # Telegram redelivers what it thinks was not received
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        await settle(gateway, lambda: texts(tg, PRIVATE))
        await until(lambda: not tg.pending_updates)  # both copies confirmed
        assert texts(tg, PRIVATE) == ["re: only once"] and len(llm.requests) == 1
        item = await store.inbox.get_by_event(f"tg:{BOT_ID}:{update['update_id']}")
        assert item is not None and item.status == "done"


async def die_before_confirming(store: Store, config: Config, tg: FakeTelegram, *, workers: bool) -> None:
    """An instance stores the queued batch, then dies before its next getUpdates (the one
    that would confirm the batch) reaches Telegram. With `workers`, it had also answered."""
    tg.hold_polls(after=1)
    gateway = Gateway(config, store=store, llm=LLMClient(config.llm, backoff_base_s=0.01), serve_http=False)
    channel = gateway.channels["telegram"]
    if workers:
        await gateway.start()
        await until(lambda: bool(texts(tg, PRIVATE)))
    else:  # only the intake ran: the batch is stored, no worker took it
        await channel.start(gateway.submit)
        poller = asyncio.create_task(channel.poll_forever())  # type: ignore[attr-defined]
    await until(lambda: bool(tg.held_polls))
    # The confirming call went out only after the batch and its offset were committed.
    (update,) = tg.pending_updates
    assert await store.inbox.get_by_event(f"tg:{BOT_ID}:{update['update_id']}") is not None
    assert (
        tg.held_polls[0]["offset"] == str(update["update_id"] + 1) == await store.inbox.load_cursor("telegram:offset")
    )
    if not workers:
        poller.cancel()
        await asyncio.gather(poller, return_exceptions=True)
    await gateway.stop()
    tg.release_polls()


@pytest.mark.parametrize("answered_before", [False, True], ids=["stored-only", "stored-and-answered"])
async def test_a_crash_between_storing_and_confirming_loses_nothing_and_repeats_nothing(
    store, llm, tg, tmp_path, answered_before
) -> None:
    llm.responder = echo
    update = tg.private_message(PRIVATE, "survive this")
    config = tg_config(llm, tg, tmp_path)
    await die_before_confirming(store, config, tg, workers=answered_before)
    assert [u["update_id"] for u in tg.pending_updates] == [update["update_id"]]  # Telegram would send it again
    assert len(texts(tg, PRIVATE)) == (1 if answered_before else 0)
    async with running(store, config) as gateway:
        await until(lambda: not tg.pending_updates)  # the stored offset confirms it at once
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        tg.private_message(PRIVATE, "still there?")
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 2)
    assert texts(tg, PRIVATE) == ["re: survive this", "re: still there?"]
    assert [user_texts(r)[-1] for r in llm.requests] == ["survive this", "still there?"]



async def test_two_instances_share_the_bot_without_fighting_over_polling(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    config = tg_config(llm, tg, tmp_path)
    async with running(store, config, instance_id="one") as one, running(store, config, instance_id="two") as two:
        for chat in (51, 52, 53, 54):
            tg.private_message(chat, f"hello from {chat}")
        await until(lambda: all(texts(tg, chat) for chat in (51, 52, 53, 54)))
        await one.inbox.wait_until_idle(10)
        await two.inbox.wait_until_idle(10)
        assert {chat: texts(tg, chat) for chat in (51, 52, 53, 54)} == {
            chat: [f"re: hello from {chat}"] for chat in (51, 52, 53, 54)}
        assert tg.conflicts == 0 and len(llm.requests) == 4
        leader = await store.inbox.lease_holder("leader")
        assert leader is not None and leader.owner in ("one", "two")


async def test_a_restart_mid_reply_leaves_one_complete_reply_in_the_group(store, llm, tg, tmp_path) -> None:
    llm.stall("The first half of the ans")
    config = tg_config(llm, tg, tmp_path, serve={"shutdown_grace": 0.2})
    async with running(store, config) as gateway:
        tg.group_message(GROUP, "@test_bot explain")
        await until(lambda: bool(texts(tg, GROUP)))
        await asyncio.wait_for(llm.stalled.wait(), 20)
    llm.reply("The whole answer, from the start.")
    async with running(store, config) as gateway:
        await settle(gateway, lambda: any("whole answer" in t for t in texts(tg, GROUP)))
        assert texts(tg, GROUP) == ["The whole answer, from the start."]


async def test_the_stop_button_cancels_a_stalled_stream(store, llm, tg, tmp_path) -> None:
    """Stop on the draft (Bot API 10.3) stops the turn as /stop does: the LLM request is
    cancelled, no call follows, and (stop_button: keep) the text so far stays as a message."""
    llm.stall("The first half of the ans")
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "explain")
        await asyncio.wait_for(llm.stalled.wait(), 20)
        await until(lambda: bool(tg.draft_params))
        shown = tg.draft_params[-1]
        assert (shown["can_stop"], shown["keep_on_stop"]) == ("true", "true")
        assert "The first half of the ans".startswith(shown["text"])
        tg.stop_generation(PRIVATE, int(shown["draft_id"]))
        await llm.wait_disconnect()
        await settle(gateway, lambda: "Stopped." in texts(tg, PRIVATE))
        kept, stopped = texts(tg, PRIVATE)  # what had arrived when the request was cancelled
        assert kept and "The first half of the ans".startswith(kept) and stopped == "Stopped."
        assert len(llm.requests) == 1
        run = (await store.runs.list())[0]
        assert run.stage == "CANCELED"
        tg.private_message(PRIVATE, "/status")  # the thread is free: the next message is answered
        await settle(gateway, lambda: len(texts(tg, PRIVATE)) == 3)
        assert len(llm.requests) == 1


def stop_read_elsewhere(draft_id: int) -> InboundMessage:
    """The /stop a Stop press amounts to, as another instance (the leader, which polls) stores
    it: this instance's channel never read the update."""
    return InboundMessage(ThreadKey("telegram", str(PRIVATE), ""), Sender(str(PRIVATE), "Ann"), "/stop",
                          f"tg:elsewhere:{draft_id}", private=True, stops_stream=str(draft_id))


async def test_a_stop_read_by_another_instance_keeps_the_text_so_far(store, llm, tg, tmp_path) -> None:
    llm.stall("The first half of the ans")
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "explain")
        await asyncio.wait_for(llm.stalled.wait(), 20)
        await until(lambda: bool(tg.draft_params))
        await gateway.inbox.submit([stop_read_elsewhere(int(tg.draft_params[-1]["draft_id"]))])
        await llm.wait_disconnect()
        await settle(gateway, lambda: "Stopped." in texts(tg, PRIVATE))
        kept, stopped = texts(tg, PRIVATE)
        assert kept and "The first half of the ans".startswith(kept) and stopped == "Stopped."


async def test_a_stop_pressed_on_a_reply_already_sent_does_not_stop_the_next_turn(store, llm, tg, tmp_path) -> None:
    llm.reply("The whole first answer, streamed as it came.")
    async with running(store, tg_config(llm, tg, tmp_path, telegram={"edit_interval_s": 0})) as gateway:
        tg.private_message(PRIVATE, "first")
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        sent_draft = int(tg.draft_params[-1]["draft_id"])
        llm.stall("The second answer so f")
        tg.private_message(PRIVATE, "second")
        await asyncio.wait_for(llm.stalled.wait(), 20)
        await gateway.inbox.submit([stop_read_elsewhere(sent_draft)])  # the press reached us late
        for _ in range(200):  # the running turn's watcher takes the item, and lets it go
            if not await store.inbox.pending(f"telegram:{PRIVATE}:"):
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        assert not llm.disconnected.is_set() and (await store.runs.list())[0].stage == "RUNNING"
        assert texts(tg, PRIVATE) == ["The whole first answer, streamed as it came."]  # no "Stopped."


async def crash(gateway: Gateway) -> None:
    """As close to kill -9 as one process allows: the gateway's tasks are cancelled where they
    stand (no shutdown path, no suspension, nothing recorded on the way out)."""
    tasks = [gateway._leader_task, gateway.inbox._dispatcher, *gateway.inbox._workers.values()]
    for task in tasks:
        if task is not None:
            task.cancel()
    await asyncio.gather(*(t for t in tasks if t is not None), return_exceptions=True)
    for channel in gateway.channels.values():
        await channel.stop()
    await gateway.llm.aclose()


async def test_a_crash_mid_reply_leaves_one_complete_reply_in_the_group(store, llm, tg, tmp_path) -> None:
    llm.stall("The first half of the ans")
    config = tg_config(llm, tg, tmp_path, inbox={"lease_ttl_s": 1})
    llm_client = LLMClient(config.llm, backoff_base_s=0.01)
    first = Gateway(config, store=store, llm=llm_client, serve_http=False, instance_id="dies")
    await first.start()
    tg.group_message(GROUP, "@test_bot explain")
    await until(lambda: bool(texts(tg, GROUP)))
    await asyncio.wait_for(llm.stalled.wait(), 20)
    (run,) = await store.runs.list()
    for _ in range(200):  # the stream records its message once Telegram has answered with its id
        partial = await store.outbox.get(f"partial:{run.id}")
        if partial is not None and partial.message_ids:
            break
        await asyncio.sleep(0.02)
    await crash(first)
    run = await store.runs.get(run.id)
    assert run.stage == "RUNNING"  # nothing was wound down
    llm.reply("The whole answer, from the start.")
    async with running(store, config, instance_id="survivor") as gateway:
        await settle(gateway, lambda: any("whole answer" in t for t in texts(tg, GROUP)))
        assert texts(tg, GROUP) == ["The whole answer, from the start."]


# --- webhook -------------------------------------------------------------------------


async def test_webhook_checks_the_secret_and_the_body_then_answers(store, llm, tg, tmp_path) -> None:
    llm.responder = echo
    url = "https://gateway.example/telegram/webhook"
    config = tg_config(llm, tg, tmp_path, telegram={"mode": "webhook", "webhook_url": url, "webhook_secret": SECRET})
    update = tg.message_update(PRIVATE, "by webhook")
    async with running(store, config, serve_http=True) as gateway, aiohttp.ClientSession() as http:
        assert tg.webhook["url"] == url and tg.webhook["secret_token"] == SECRET
        endpoint = f"http://127.0.0.1:{gateway.http.port}/telegram/webhook"  # type: ignore[union-attr]

        async def post(body: bytes, secret: str | None = SECRET) -> int:
            headers = {"Content-Type": "application/json"}
            if secret is not None:
                headers["X-Telegram-Bot-Api-Secret-Token"] = secret
            async with http.post(endpoint, data=body, headers=headers) as response:
                return response.status

        good = json.dumps(update).encode()
        assert await post(good, secret=None) == 401
        assert await post(good, secret="wrong-secret") == 401
        assert await post(b"{not json") == 400
        assert await post(b'{"message": {}}') == 400
        assert await store.inbox.count_pending() == 0 and not llm.requests
        assert await post(good) == 200
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        assert await post(good) == 200  # a redelivery is acknowledged and ignored
        await gateway.inbox.wait_until_idle(10)
        assert texts(tg, PRIVATE) == ["re: by webhook"] and len(llm.requests) == 1
        assert not tg.calls_to("getUpdates")  # webhook mode never polls


# --- flood limits, formatting, streaming ---------------------------------------------


async def test_a_flood_limit_on_send_is_waited_out(store, llm, tg, tmp_path) -> None:
    llm.reply("after the wait")
    tg.fail_next("sendMessage", "429", retry_after=1)
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "hi")
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        assert texts(tg, PRIVATE) == ["after the wait"]
        first, second = [c for c in tg.calls_to("sendMessage")]
        assert second.at - first.at >= 0.95  # retried only after retry_after
        run = (await store.runs.list())[0]
        assert run.stage == "SUCCESS"


@pytest.mark.parametrize("progress, chat", [("sendMessageDraft", PRIVATE), ("editMessageText", GROUP)])
async def test_a_flood_wait_met_by_streamed_progress_holds_the_final_message(store, llm, tg, tmp_path, progress, chat):
    """The stream swallowed the 429 of a draft or progress edit and the final message went out
    at once, into the flood wait Telegram had just set for the chat."""
    tg.keep_flood_waits()
    llm.reply(LONG_REPLY)
    tg.fail_next(progress, "429", retry_after=2)
    config = tg_config(llm, tg, tmp_path, telegram={"edit_interval_s": 0})
    async with running(store, config) as gateway:
        (tg.private_message if chat == PRIVATE else tg.group_message)(chat, "@test_bot tell me a lot")
        await settle(gateway, lambda: LONG_REPLY in texts(tg, chat))
    assert tg.flood_violations == []
    refused = tg.calls_to(progress)[0]  # the 429
    final = [
        c
        for c in tg.calls
        if c.method in ("sendMessage", "editMessageText") and c.params.get("text") == LONG_REPLY
    ]
    assert final and final[-1].at - refused.at >= 1.95


async def test_rejected_formatting_is_resent_as_plain_text(store, llm, tg, tmp_path) -> None:
    llm.reply("Some **bold** text")
    tg.fail_next("sendMessage", "parse")
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "hi")
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        formatted, plain = sent_to(tg, PRIVATE)
        assert formatted["entities"] and "entities" not in plain
        (message,) = tg.bot_messages(PRIVATE)
        assert (message.text, message.entities) == ("Some bold text", [])


LONG_REPLY = " ".join(f"word{n}" for n in range(60))


async def test_private_replies_stream_as_drafts_then_one_message(store, llm, tg, tmp_path) -> None:
    llm.reply(LONG_REPLY)
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "tell me a lot")
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        drafts = tg.drafts[PRIVATE]
        assert len(drafts) >= 5
        assert all(LONG_REPLY.startswith(d) for d in drafts) and drafts == sorted(drafts, key=len)
        assert len({c.params["draft_id"] for c in tg.calls_to("sendMessageDraft")}) == 1
        assert texts(tg, PRIVATE) == [LONG_REPLY]
        assert len(sent_to(tg, PRIVATE)) == 1 and not tg.calls_to("editMessageText")
        assert sent_to(tg, PRIVATE, "sendChatAction")  # typing while the turn ran


@pytest.mark.parametrize("refused", [False, True])
async def test_a_table_reply_is_one_rich_message_or_plain_text_when_refused(store, llm, tg, tmp_path, refused) -> None:
    """telegram.rich_messages: on (Bot API 10.1): a reply with a table goes as sendRichMessage
    with the model's Markdown; when Telegram refuses it, as today's plain messages."""
    table = "| item | price |\n|---|---:|\n| tea | 2 |"
    llm.reply(table)
    tg.refuse_rich = "RICH_VALIDATE_CTOR_NOT_ALLOWED" if refused else ""
    async with running(store, tg_config(llm, tg, tmp_path, telegram={"rich_messages": "on"})) as gateway:
        tg.private_message(PRIVATE, "prices?")
        await settle(gateway, lambda: bool(tg.bot_messages(PRIVATE)))
        (message,) = tg.bot_messages(PRIVATE)
        assert len(tg.calls_to("sendRichMessage")) == 1
        if refused:
            assert message.rich is None and "tea" in message.text and "|---" not in message.text
        else:
            assert message.rich == {"markdown": table} and not tg.calls_to("sendMessage")
        run = (await store.runs.list())[0]
        assert (run.stage, run.end_reason) == ("SUCCESS", "reply")


@pytest.mark.parametrize("rich", ["on", "off"])
async def test_a_reasoning_model_shows_a_thinking_block_in_the_draft_until_it_writes(
    store, llm, tg, tmp_path, rich
) -> None:
    """Rich messages on (Bot API 10.2): while the model reasons and has written nothing, the
    private chat's draft is Telegram's "Thinking…" block (sendRichMessageDraft, once), then the
    text drafts take the same draft over; off, nothing but the text drafts."""
    llm.reasoning("Let me weigh the options carefully. " * 5, LONG_REPLY)
    config = tg_config(llm, tg, tmp_path, telegram={"rich_messages": rich, "edit_interval_s": 0})
    async with running(store, config) as gateway:
        tg.private_message(PRIVATE, "which one?")
        await settle(gateway, lambda: LONG_REPLY in texts(tg, PRIVATE))
    drafts = tg.calls_to("sendMessageDraft")
    assert drafts, "the text was drafted as it grew"
    if rich == "off":
        assert tg.rich_drafts == []
        return
    (thinking,) = tg.rich_drafts
    assert thinking["rich_message"] == {"blocks": [{"type": "thinking", "text": "Thinking…"}]}
    assert int(thinking["draft_id"]) == int(drafts[0].params["draft_id"])  # the text replaces it in place
    first_text = next(i for i, c in enumerate(tg.calls) if c.method == "sendMessageDraft")
    assert next(i for i, c in enumerate(tg.calls) if c.method == "sendRichMessageDraft") < first_text


async def test_a_server_that_refuses_rich_drafts_still_gets_the_text_drafts(store, llm, tg, tmp_path) -> None:
    llm.reasoning("Thinking it over. " * 5, LONG_REPLY)
    tg.refuse_rich = "METHOD_NOT_FOUND"
    config = tg_config(llm, tg, tmp_path, telegram={"rich_messages": "on", "edit_interval_s": 0})
    async with running(store, config) as gateway:
        tg.private_message(PRIVATE, "which one?")
        await settle(gateway, lambda: LONG_REPLY in texts(tg, PRIVATE))
    assert len(tg.calls_to("sendRichMessageDraft")) == 1 and tg.rich_drafts == []
    assert tg.calls_to("sendMessageDraft") and texts(tg, PRIVATE) == [LONG_REPLY]


@pytest.mark.parametrize("rich", ["off", "on", "refused"])
async def test_a_collapsible_section_of_a_reply_is_collapsed(store, llm, tg, tmp_path, rich) -> None:
    """`<details><summary>` in the model's reply: a rich message's details block (the HTML form,
    only the section made a tag), or in plain messages the summary over an expandable quote."""
    reply = "Done.\n\n<details>\n<summary>Build log</summary>\n\n```\nok 12 tests\n```\n</details>"
    llm.reply(reply)
    tg.refuse_rich = "RICH_VALIDATE_CTOR_NOT_ALLOWED" if rich == "refused" else ""
    config = tg_config(llm, tg, tmp_path, telegram={"rich_messages": "off" if rich == "off" else "on"})
    async with running(store, config) as gateway:
        tg.private_message(PRIVATE, "build it")
        await settle(gateway, lambda: bool(tg.bot_messages(PRIVATE)))
    (message,) = tg.bot_messages(PRIVATE)
    if rich == "on":
        assert message.rich is not None and "markdown" not in message.rich
        assert "<details><summary>Build log</summary><pre><code>ok 12 tests" in message.rich["html"]
        return
    assert message.rich is None and message.text == "Done.\n\nBuild log\nok 12 tests"
    quote = next(e for e in message.entities if e["type"] == "expandable_blockquote")
    assert message.text[quote["offset"]:quote["offset"] + quote["length"]] == "ok 12 tests"


async def test_rich_messages_are_chosen_per_chat_with_the_rich_command(store, llm, tg, tmp_path) -> None:
    """`/rich on` in one chat (the default off): its table reply is a rich message, another
    chat's stays plain; `/rich off` where the default is on goes back to plain messages."""
    table = "| item | price |\n|---|---:|\n| tea | 2 |"
    async with running(store, tg_config(llm, tg, tmp_path)) as gateway:
        tg.private_message(PRIVATE, "/rich on")
        await settle(gateway, lambda: bool(texts(tg, PRIVATE)))
        assert "Rich messages are on" in texts(tg, PRIVATE)[0]
        llm.reply(table)
        tg.private_message(PRIVATE, "prices?")
        await settle(gateway, lambda: len(tg.bot_messages(PRIVATE)) == 2)
        assert tg.bot_messages(PRIVATE)[1].rich == {"markdown": table}
        llm.reply(table)
        tg.private_message(OTHER_PRIVATE, "prices?", user_id=OTHER_PRIVATE)
        await settle(gateway, lambda: bool(tg.bot_messages(OTHER_PRIVATE)))
        assert tg.bot_messages(OTHER_PRIVATE)[0].rich is None and len(tg.calls_to("sendRichMessage")) == 1
        tg.private_message(OTHER_PRIVATE, "/rich", user_id=OTHER_PRIVATE)
        await settle(gateway, lambda: len(tg.bot_messages(OTHER_PRIVATE)) == 2)
        assert "Rich messages are off in this chat" in texts(tg, OTHER_PRIVATE)[1]
    async with running(store, tg_config(llm, tg, tmp_path, telegram={"rich_messages": "on"})) as gateway:
        tg.private_message(PRIVATE, "/rich off")
        await settle(gateway, lambda: len(tg.bot_messages(PRIVATE)) == 3)
        llm.reply(table)
        tg.private_message(PRIVATE, "prices again?")
        await settle(gateway, lambda: len(tg.bot_messages(PRIVATE)) == 4)
        assert tg.bot_messages(PRIVATE)[3].rich is None and len(tg.calls_to("sendRichMessage")) == 1


async def test_in_a_group_only_an_admin_switches_rich_messages(store, llm, tg, tmp_path) -> None:
    approvals = {"admins": {"telegram": [7]}}
    async with running(store, tg_config(llm, tg, tmp_path, approvals=approvals)) as gateway:
        tg.group_message(GROUP, "/rich on", user_id=43)
        await settle(gateway, lambda: bool(texts(tg, GROUP)))
        assert texts(tg, GROUP)[0].startswith("Only an admin can switch rich messages in a group.")
        assert await store.preferences.rich(f"telegram:{GROUP}") is None
        tg.group_message(GROUP, "/rich on", user_id=7)
        await settle(gateway, lambda: len(texts(tg, GROUP)) == 2)
        assert await store.preferences.rich(f"telegram:{GROUP}") is True


@pytest.mark.parametrize("interval, edits", [(0, "many"), (3600, "final only")])
async def test_group_replies_stream_by_throttled_edits(store, llm, tg, tmp_path, interval, edits) -> None:
    llm.reply(LONG_REPLY)
    config = tg_config(llm, tg, tmp_path, telegram={"edit_interval_s": interval})
    async with running(store, config) as gateway:
        tg.group_message(GROUP, "@test_bot tell me a lot")
        await settle(gateway, lambda: LONG_REPLY in texts(tg, GROUP))
        (first,) = sent_to(tg, GROUP)
        changes = sent_to(tg, GROUP, "editMessageText")
        if edits == "many":
            assert LONG_REPLY.startswith(first["text"]) and len(first["text"]) < len(LONG_REPLY)
            assert changes[-1]["text"] == LONG_REPLY and len(changes) >= 5
            assert {int(c["message_id"]) for c in changes} == {tg.bot_messages(GROUP)[0].message_id}
        else:  # done within the interval: the reply is sent once, nothing shown before it
            assert first["text"] == LONG_REPLY and changes == []
        assert texts(tg, GROUP) == [LONG_REPLY] and not tg.calls_to("sendMessageDraft")


# --- scheduled jobs ------------------------------------------------------------------


@pytest.mark.parametrize("inline", [False, True])  # True: Run again reported by inline_message_id (10.5)
async def test_a_scheduled_job_delivers_to_telegram_and_runs_again_with_approval(
    store, llm, tg, tmp_path, inline
) -> None:
    from datetime import datetime

    job = {"name": "nightly", "cron": "0 3 * * *", "prompt": "Write the report.", "deliver_to": f"telegram:{PRIVATE}"}
    config = tg_config(
        llm, tg, tmp_path, scheduler={"enabled": True, "jobs": [job]}, approvals={"admins": {"telegram": [PRIVATE]}}
    )
    llm.tool_call("write_file", {"path": "report.txt", "content": "night"}, id="w1")
    llm.reply("The report could not be written.")
    async with running(store, config) as gateway:
        schedule = await store.schedules.by_name("nightly")
        await gateway.scheduler.fire(schedule.id, datetime.now(UTC))
        await settle(gateway, lambda: has_prompt(tg, PRIVATE))
        notice = prompt_message(tg, PRIVATE)
        assert "nightly" in notice.text and "write_file" in notice.text
        assert not session_file(tmp_path / "ws", "report.txt").exists()
        llm.tool_call("write_file", {"path": "report.txt", "content": "night"}, id="w2")
        llm.reply("Report written.")
        tap = tg.inline_press if inline else tg.press
        tap(PRIVATE, notice.message_id, button(notice, "Run again"), user_id=PRIVATE)
        shown = tg.messages[PRIVATE]
        # run again once: the buttons go and the outcome is written (two edits, in either order)
        await until(
            lambda: not shown[notice.message_id].buttons
            and shown[notice.message_id].text.endswith("🔁 Run again by Ann")
        )
        await settle(
            gateway,
            lambda: (
                sum(1 for m in tg.bot_messages(PRIVATE) if m.buttons) >= 1
                and any("write_file" in m.text for m in tg.bot_messages(PRIVATE)[1:])
            ),
        )
        approval = next(m for m in tg.bot_messages(PRIVATE)[1:] if m.buttons)
        tg.press(PRIVATE, approval.message_id, button(approval, "Approve"), user_id=PRIVATE)
        await settle(gateway, lambda: "Report written." in texts(tg, PRIVATE))
        assert session_file(tmp_path / "ws", "report.txt").read_text() == "night"
