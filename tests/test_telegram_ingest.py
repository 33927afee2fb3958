"""Telegram ingest: updates -> events, polling offsets, webhook, callbacks, access."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from fakes.telegram import BOT_ID, FakeTelegram
from fakes.telegram_core import RecordingCore
from helpers import until

from channels.telegram import TelegramChannel
from gateway.config import TelegramConfig
from gateway.events import ButtonPress, ChannelError, InboundMessage, ThreadKey

SECRET = "s3cret-token_value"


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@pytest.fixture
def core() -> RecordingCore:
    return RecordingCore()


@pytest.fixture
async def make(fake: FakeTelegram, core: RecordingCore) -> AsyncIterator[Callable[..., Any]]:
    channels: list[TelegramChannel] = []

    async def build(**settings: Any) -> TelegramChannel:
        config = TelegramConfig(token=fake.token, api_base_url=fake.base_url, poll_timeout_s=1, **settings)
        channel = TelegramChannel(config, core)
        channel.poll_backoff_s = 0.05
        await channel.start(core.submit)
        channels.append(channel)
        return channel

    yield build
    for channel in channels:
        await channel.stop()


async def poll_until(channel: TelegramChannel, condition: Callable[[], bool]) -> None:
    task = asyncio.create_task(channel.poll_forever())
    try:
        await until(condition)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def ingest(channel: TelegramChannel, core: RecordingCore, fake: FakeTelegram, *, answers: int = 0) -> list[Any]:
    """Poll until every queued update has been submitted (the batch may be all filtered) and
    `answers` callback queries have been answered: answers go after the batch is submitted, so a
    poller cancelled once the offset is committed may not have sent them yet."""
    last = fake.pending_updates[-1]["update_id"]
    await poll_until(channel, lambda: core.cursors.get("telegram:offset") == str(last + 1)
                     and len(fake.calls_to("answerCallbackQuery")) >= answers)
    return core.events


# --- messages -> events ---------------------------------------------------------------


async def test_private_message_becomes_an_event(make, fake, core) -> None:
    channel = await make()
    update = fake.private_message(42, "hello **there**", first_name="Ann", username="ann")
    (event,) = await ingest(channel, core, fake)
    assert isinstance(event, InboundMessage)
    assert event.thread == ThreadKey("telegram", "42", "")
    assert event.text == "hello **there**"
    assert event.event_id == f"tg:{BOT_ID}:{update['update_id']}"
    assert event.message_id == str(update["message"]["message_id"])
    assert (event.sender.id, event.sender.name, event.sender.username) == ("42", "Ann", "ann")


async def test_group_messages_pass_only_when_addressed_to_the_bot(make, fake, core) -> None:
    channel = await make()
    bot_message = (await channel.bot.send_message(-100, "I am the bot")).message_id
    fake.group_message(-100, "just chatting")
    fake.group_message(-100, "@test_bot, what time is it?")
    fake.group_message(-100, "thanks", reply_to=bot_message)
    fake.group_message(-100, "/status@test_bot now")
    fake.group_message(-100, "/status@other_bot")
    fake.group_message(-100, "/help")
    fake.group_message(-100, "ask @someone_else")
    texts = [e.text for e in await ingest(channel, core, fake)]
    assert texts == ["what time is it?", "thanks", "/status now", "/help"]


async def test_group_trigger_all_passes_everything_but_other_bots_commands(make, fake, core) -> None:
    channel = await make(group_trigger="all")
    fake.group_message(-100, "just chatting")
    fake.group_message(-100, "/status@other_bot")
    assert [e.text for e in await ingest(channel, core, fake)] == ["just chatting"]


async def test_forum_topics_are_separate_threads(make, fake, core) -> None:
    channel = await make(group_trigger="all")
    fake.topic_message(-100, 11, "in topic eleven")
    fake.topic_message(-100, 12, "in topic twelve")
    fake.group_message(-100, "in general")
    threads = [e.thread for e in await ingest(channel, core, fake)]
    assert threads == [
        ThreadKey("telegram", "-100", "11"),
        ThreadKey("telegram", "-100", "12"),
        ThreadKey("telegram", "-100", ""),
    ]


async def test_attachments_become_metadata_with_the_caption_as_text(make, fake, core) -> None:
    channel = await make()
    fake.enqueue(fake.message_update(42, "look at this", user_id=42, photo=True))
    fake.enqueue(
        fake.message_update(
            42,
            "",
            user_id=42,
            document={"file_id": "doc-1", "file_name": "report.pdf", "mime_type": "application/pdf", "file_size": 1234},
        )
    )
    voice = fake.files.voice(b"OggS-voice", duration=7)
    fake.enqueue(fake.message_update(42, "", user_id=42, media={"voice": voice}))
    fake.enqueue(
        fake.message_update(
            42,
            "",
            user_id=42,
            media={
                "sticker": {
                    "file_id": "st",
                    "file_unique_id": "st",
                    "type": "regular",
                    "width": 512,
                    "height": 512,
                    "is_animated": False,
                    "is_video": False,
                    "emoji": "👍",
                }
            },
        )
    )
    photo, document, note, sticker = await ingest(channel, core, fake)
    assert photo.text == "look at this"  # the core adds what the files are, once it has them
    [largest] = photo.attachments
    assert (largest.kind, largest.file_id, largest.size, largest.width, largest.height) == (
        "photo",
        "large",
        90_000,
        900,
        900,
    )
    assert document.text == "" and document.attachments[0].name == "report.pdf"
    assert document.attachments[0].mime == "application/pdf"
    assert [(a.kind, a.duration, a.mime) for a in note.attachments] == [("voice", 7, "audio/ogg")]
    assert sticker.text == "👍" and sticker.attachments == ()


async def test_album_parts_share_a_group(make, fake, core) -> None:
    channel = await make()
    for caption in ("two views", ""):
        fake.enqueue(
            fake.message_update(
                42,
                caption,
                user_id=42,
                media={"photo": fake.files.photo(b"\xff\xd8\xff-jpeg", 800, 600), "media_group_id": "album-1"},
            )
        )
    first, second = await ingest(channel, core, fake)
    assert first.group == second.group == "42:album-1"
    assert first.event_id != second.event_id


async def test_bots_are_ignored_and_edits_name_the_message_they_edit(make, fake, core) -> None:
    channel = await make()
    fake.enqueue(fake.message_update(42, "from a bot", user_id=99, is_bot=True))
    assert await ingest(channel, core, fake) == []
    assert core.batches[-1][0] == []  # the batch was still submitted: its offset is stored

    original = fake.private_message(42, "fixed typo")
    (first,) = await ingest(channel, core, fake)
    fake.edit(42, original["message"]["message_id"], "fixed again")
    event = (await ingest(channel, core, fake))[-1]
    assert (event.text, event.edit_of) == ("fixed again", first.message_id)
    assert event.event_id != first.event_id  # each edit is its own update


# --- polling: offsets and failures ------------------------------------------------------


async def test_offset_is_committed_before_it_is_confirmed(make, fake, core) -> None:
    channel = await make()
    first = fake.private_message(42, "one")
    fake.private_message(42, "two")
    polls_at_submit: list[int] = []
    core.on_submit = lambda events, cursor: polls_at_submit.append(len(fake.calls_to("getUpdates")))
    await ingest(channel, core, fake)
    next_offset = first["update_id"] + 2
    assert core.batches[0][1] == ("telegram:offset", str(next_offset))
    polls = fake.calls_to("getUpdates")
    confirming = next(n for n, c in enumerate(polls) if c.params.get("offset") == str(next_offset))
    assert confirming >= polls_at_submit[0]  # the confirming poll was sent after submit returned
    assert "offset" not in polls[0].params


async def test_a_failed_submit_rereads_the_same_updates(make, fake, core) -> None:
    channel = await make()
    fake.private_message(42, "one")
    fake.private_message(42, "two")
    core.fail_submits = 1
    events = await ingest(channel, core, fake)
    assert [e.text for e in events] == ["one", "two"]
    assert len(core.batches) == 1  # the failed attempt stored nothing; the retry stored all
    assert all("offset" not in c.params for c in fake.calls_to("getUpdates")[:2])


async def test_polling_resumes_from_the_stored_offset(make, fake, core) -> None:
    channel = await make()
    old = fake.private_message(42, "already stored")
    core.cursors["telegram:offset"] = str(old["update_id"] + 1)
    fake.private_message(42, "new")
    assert [e.text for e in await ingest(channel, core, fake)] == ["new"]
    assert fake.calls_to("getUpdates")[0].params["offset"] == str(old["update_id"] + 1)


async def test_conflict_is_reported_and_polling_recovers(make, fake, core, caplog) -> None:
    channel = await make()
    fake.fail_next("getUpdates", "409")
    fake.private_message(42, "after the conflict")
    with caplog.at_level(logging.ERROR, logger="channels.telegram"):
        assert [e.text for e in await ingest(channel, core, fake)] == ["after the conflict"]
    assert any("409 Conflict" in r.getMessage() for r in caplog.records)


async def test_a_private_chats_topics_are_threads_of_their_own(make, fake, core) -> None:
    """Bot API 9.3: a bot with topics enabled gets private messages with message_thread_id and
    is_topic_message; each topic is a thread, the chat outside them another."""
    channel = await make()
    fake.private_message(42, "in topic 3", thread_id=3)
    fake.private_message(42, "in topic 4", thread_id=4)
    fake.private_message(42, "outside topics")
    events = await ingest(channel, core, fake)
    assert [(e.thread, e.private) for e in events] == [
        (ThreadKey("telegram", "42", "3"), True),
        (ThreadKey("telegram", "42", "4"), True),
        (ThreadKey("telegram", "42", ""), True),
    ]


# --- callbacks --------------------------------------------------------------------------


async def test_button_press_is_submitted_then_answered(make, fake, core) -> None:
    channel = await make()
    prompt = await channel.bot.send_message(-100, "Approve?")
    core.answers["tok-1"] = ("This prompt was already decided.", True)
    update = fake.press(-100, prompt.message_id, "tok-1", user_id=7, first_name="Bob")
    (event,) = await ingest(channel, core, fake, answers=1)
    assert isinstance(event, ButtonPress)
    assert (event.token, event.message_id, event.sender.id) == ("tok-1", str(prompt.message_id), "7")
    assert event.thread == ThreadKey("telegram", "-100", "")
    (answer,) = fake.calls_to("answerCallbackQuery")
    assert answer.params["callback_query_id"] == update["callback_query"]["id"]
    assert answer.params["text"] == "This prompt was already decided."
    assert answer.params["show_alert"] == "true"


async def test_a_press_reported_by_inline_message_id_is_submitted_without_a_chat(make, fake, core) -> None:
    """Bot API 10.5 `callback_query_mode`: the query names the message by inline_message_id and
    carries no chat; the core finds the thread by the token."""
    channel = await make(allowed_users=["7"])
    prompt = await channel.bot.send_message(-100, "Approve?")
    core.answers["tok-1"] = ("✅ Approved by Bob", False)
    update = fake.inline_press(-100, prompt.message_id, "tok-1", user_id=7, first_name="Bob")
    fake.inline_press(-100, prompt.message_id, "tok-1", user_id=555)  # not on allowed_users
    (event,) = await ingest(channel, core, fake, answers=2)
    assert isinstance(event, ButtonPress)
    assert (event.token, event.sender.id, event.message_id) == ("tok-1", "7", "")
    assert event.thread == ThreadKey("telegram", "", "")
    first, second = fake.calls_to("answerCallbackQuery")
    assert first.params["callback_query_id"] == update["callback_query"]["id"]
    assert first.params["text"] == "✅ Approved by Bob" and first.params.get("show_alert") != "true"
    assert second.params["show_alert"] == "true" and "not allowed" in second.params["text"]


async def test_a_press_without_chat_is_refused_when_only_chats_are_listed(make, fake, core) -> None:
    channel = await make(allowed_chats=["-100"])  # the tap's chat is unknown: fail closed
    prompt = await channel.bot.send_message(-100, "Approve?")
    fake.inline_press(-100, prompt.message_id, "tok", user_id=7)
    assert await ingest(channel, core, fake, answers=1) == []
    (answer,) = fake.calls_to("answerCallbackQuery")
    assert answer.params["show_alert"] == "true" and "not allowed" in answer.params["text"]


async def test_start_reads_the_full_bot_info_whatever_fields_it_has(make, fake, core, caplog) -> None:
    """getMe returns BotFullInfo since Bot API 10.5, and may grow: the channel starts and
    reads its own name from it."""
    fake.bot_settings = {"callback_query_mode": "inline", "a_field_of_a_later_version": {"nested": [1, 2]}}
    channel = await make()
    fake.group_message(-100, "@test_bot hi")
    (event,) = await ingest(channel, core, fake)
    assert event.text == "hi"


async def test_stop_pressed_on_a_draft_is_the_persons_stop_in_its_thread(make, fake, core) -> None:
    """Bot API 10.3 stopped_message_generation (chat, message_thread_id, draft_id)."""
    channel = await make(edit_interval_s=0, allowed_users=["42"])
    stream = channel.open_stream(ThreadKey("telegram", "42", "3"))
    await stream.update("half an ans")
    draft = int(fake.calls_to("sendMessageDraft")[0].params["draft_id"])
    update = fake.stop_generation(42, draft, thread_id=3)
    (event,) = await ingest(channel, core, fake)
    assert isinstance(event, InboundMessage) and event.text == "/stop" and event.private
    assert event.thread == ThreadKey("telegram", "42", "3")
    assert (event.sender.id, event.sender.name) == ("42", "Ann")
    assert event.event_id == f"tg:{BOT_ID}:{update['update_id']}"


async def test_stop_pressed_on_a_reply_already_sent_or_by_a_stranger_stops_nothing(make, fake, core, caplog) -> None:
    caplog.set_level(logging.DEBUG, "channels.telegram")
    channel = await make(edit_interval_s=0, allowed_users=["42"])
    sent = channel.open_stream(ThreadKey("telegram", "42", ""))
    await sent.update("the whole")
    await sent.finish("the whole answer")
    stranger = channel.open_stream(ThreadKey("telegram", "555", ""))
    await stranger.update("hi")
    first, second = (int(c.params["draft_id"]) for c in fake.calls_to("sendMessageDraft"))
    fake.stop_generation(42, first)
    fake.stop_generation(555, second)
    assert await ingest(channel, core, fake) == []
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "Stop pressed on a reply already sent" in said and "a stop by someone not allowed" in said


# --- access -----------------------------------------------------------------------------


async def test_strangers_are_refused_once_a_day_in_private_and_ignored_in_groups(make, fake, core) -> None:
    channel = await make(allowed_users=["1", "@boss"])
    fake.private_message(555, "hi", user_id=555, username="stranger")
    fake.private_message(555, "hello??", user_id=555, username="stranger")
    fake.group_message(-100, "@test_bot hi", user_id=555, username="stranger")
    fake.private_message(77, "it's me", user_id=77, username="Boss")
    events = await ingest(channel, core, fake)
    assert [e.text for e in events] == ["it's me"]
    refusals = fake.bot_messages(555)
    assert len(refusals) == 1 and "555" in refusals[0].text
    assert fake.bot_messages(-100) == []


async def test_strangers_buttons_get_an_alert_and_nothing_is_submitted(make, fake, core) -> None:
    channel = await make(allowed_chats=["-100"])
    prompt = await channel.bot.send_message(-200, "Approve?")
    fake.press(-200, prompt.message_id, "tok", user_id=555)
    assert await ingest(channel, core, fake, answers=1) == []
    (answer,) = fake.calls_to("answerCallbackQuery")
    assert answer.params["show_alert"] == "true" and "not allowed" in answer.params["text"]


# --- webhook ----------------------------------------------------------------------------


@pytest.fixture
async def webhook(make) -> AsyncIterator[tuple[TelegramChannel, str]]:
    channel = await make(mode="webhook", webhook_secret=SECRET, webhook_url="https://gw.example/telegram/webhook")
    app = web.Application()
    for method, path, handler in channel.routes():
        app.router.add_route(method, path, handler)
    async with TestServer(app, host="127.0.0.1") as server:
        yield channel, str(server.make_url("/telegram/webhook"))


async def post(url: str, body: bytes | str, secret: str | None) -> int:
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers["X-Telegram-Bot-Api-Secret-Token"] = secret
    async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as response:
        return response.status


async def test_webhook_mode_registers_the_secret_and_update_types(webhook, fake) -> None:
    (call,) = fake.calls_to("setWebhook")
    assert call.params["secret_token"] == SECRET
    assert call.params["url"] == "https://gw.example/telegram/webhook"
    assert set(call.params["allowed_updates"]) == {
        "message", "edited_message", "callback_query", "my_chat_member", "message_reaction",
        "stopped_message_generation",
    }


async def test_webhook_rejects_bad_secrets_and_bodies(webhook, fake, core) -> None:
    _, url = webhook
    update = json.dumps(fake.message_update(42, "hi", user_id=42))
    assert await post(url, update, None) == 401
    assert await post(url, update, "wrong") == 401
    assert await post(url, "{not json", SECRET) == 400
    assert await post(url, json.dumps({"hello": "world"}), SECRET) == 400
    assert core.events == []


async def test_updates_the_gateway_does_not_read_are_ignored_with_their_kind(webhook, fake, core, caplog) -> None:
    caplog.set_level(logging.DEBUG, "channels.telegram")
    _, url = webhook
    chat = {"id": -100, "type": "supergroup", "title": "G"}
    guest = {"message_id": 1, "date": 0, "chat": chat, "text": "@test_bot x", "guest_query_id": "gq-7"}
    assert await post(url, json.dumps({"update_id": 1, "guest_message": guest}), SECRET) == 200
    assert await post(url, json.dumps({"update_id": 2, "a_kind_of_a_later_version": {"chat": chat}}), SECRET) == 200
    assert core.events == []
    said = [r.getMessage() for r in caplog.records]
    assert "telegram: update 1 ignored: guest_message (not read by the gateway)" in said
    assert "telegram: update 2 ignored: a_kind_of_a_later_version (not read by the gateway)" in said


async def test_webhook_answers_200_only_after_submit(webhook, fake, core) -> None:
    _, url = webhook
    update = fake.message_update(42, "hi", user_id=42)
    core.fail_submits = 1
    assert await post(url, json.dumps(update), SECRET) == 500  # Telegram will deliver it again
    assert await post(url, json.dumps(update), SECRET) == 200
    assert [e.text for e in core.events] == ["hi"]
    assert core.batches[0][1] is None  # no polling offset in webhook mode


async def test_the_same_update_delivered_twice_keeps_its_event_id(webhook, fake, core) -> None:
    _, url = webhook
    update = fake.message_update(42, "once", user_id=42)
    assert await post(url, json.dumps(update), SECRET) == 200
    assert await post(url, json.dumps(update), SECRET) == 200
    first, second = core.events
    assert first.event_id == second.event_id == f"tg:{BOT_ID}:{update['update_id']}"


async def test_webhook_mode_refuses_to_start_without_a_secret(fake, core) -> None:
    config = TelegramConfig(
        token=fake.token, api_base_url=fake.base_url, mode="webhook", webhook_url="https://gw.example/telegram/webhook"
    )
    with pytest.raises(ChannelError, match="webhook_secret"):
        await TelegramChannel(config, core).start(core.submit)
    assert fake.calls_to("setWebhook") == []


async def test_a_rejected_token_is_a_clear_error(fake, core) -> None:
    config = TelegramConfig(token="999:wrong", api_base_url=fake.base_url)
    with pytest.raises(ChannelError, match="token was rejected") as caught:
        await TelegramChannel(config, core).start(core.submit)
    assert "999:wrong" not in str(caught.value)


async def test_channel_posts_their_edits_and_other_reactions_are_ignored(make, fake, core) -> None:
    channel = await make()
    fake.chat_types[-100900] = "channel"
    post = fake.message_update(-100900, "news", chat_type="channel", kind="channel_post")
    fake.enqueue(post)
    fake.edit(-100900, post["channel_post"]["message_id"], "news, fixed")
    fake.react(42, 1, ["🔥"])
    assert await ingest(channel, core, fake) == []
    fake.react(42, 1, ["👍", "🔥"], ["🔥"])
    (event,) = await ingest(channel, core, fake)
    assert (event.kind, event.added, event.removed, event.message_id) == ("reaction", ("up",), (), "1")
