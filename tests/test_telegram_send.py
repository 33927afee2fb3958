"""Telegram output: replies, splitting, flood waits, fallbacks, prompts, streaming, typing."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from fakes.telegram import FakeTelegram, utf16_len
from fakes.telegram_core import RecordingCore

from channels.telegram import TelegramChannel
from gateway.config import TelegramConfig
from gateway.events import Button, ChannelError, Outbound, Prompt, ThreadKey, links_in

PRIVATE = ThreadKey("telegram", "42", "")
GROUP = ThreadKey("telegram", "-100", "")
TOPIC = ThreadKey("telegram", "-100", "7")


@pytest.fixture
async def fake() -> AsyncIterator[FakeTelegram]:
    async with FakeTelegram() as server:
        yield server


@pytest.fixture
async def make(fake: FakeTelegram) -> AsyncIterator[Callable[..., Any]]:
    channels: list[TelegramChannel] = []

    async def build(**settings: Any) -> TelegramChannel:
        settings.setdefault("rate_private_per_s", 0)  # pacing is not what these tests look at
        settings.setdefault("rate_group_per_min", 0)
        config = TelegramConfig(token=fake.token, api_base_url=fake.base_url, **settings)
        core = RecordingCore()
        channel = TelegramChannel(config, core)
        await channel.start(core.submit)
        channels.append(channel)
        return channel

    yield build
    for channel in channels:
        await channel.stop()


def reply(thread: ThreadKey, text: str, **kw: Any) -> Outbound:
    return Outbound(thread=thread, text=text, key="k1", **kw)


# --- send -------------------------------------------------------------------------------


async def test_markdown_reply_arrives_as_text_with_entities(make, fake) -> None:
    channel = await make()
    delivered = await channel.send(reply(PRIVATE, "😀 **Done** with `a<b`"))
    (message,) = fake.bot_messages(42)
    assert delivered.message_ids == (str(message.message_id),)
    assert message.text == "😀 Done with a<b"
    assert {(e["type"], e["offset"], e["length"]) for e in message.entities} == {("bold", 3, 4), ("code", 13, 3)}


async def test_long_reply_is_split_into_messages_in_the_topic(make, fake) -> None:
    channel = await make()
    text = "\n\n".join(f"Paragraph {n} " + "lorem ipsum " * 40 for n in range(40))
    delivered = await channel.send(reply(TOPIC, text, reply_to="3"))
    sent = fake.bot_messages(-100)
    assert len(sent) >= 4 and delivered.message_ids == tuple(str(m.message_id) for m in sent)
    assert all(utf16_len(m.text) <= 4096 and m.thread_id == 7 for m in sent)
    assert sent[0].reply_to == 3 and all(m.reply_to is None for m in sent[1:])
    assert " ".join(" ".join(m.text.split()) for m in sent) == " ".join(text.split())


async def test_a_flood_wait_is_handed_back_at_once_for_the_outbox_to_wait(make, fake) -> None:
    channel = await make()
    fake.fail_next("sendMessage", "429", retry_after=3600)
    with pytest.raises(ChannelError) as caught:
        await channel.send(reply(PRIVATE, "hello"))
    assert caught.value.retry_after == 3600 and not caught.value.permanent and not caught.value.ambiguous
    assert len(fake.calls_to("sendMessage")) == 1


async def test_sends_queued_behind_a_flood_wait_are_handed_back_not_sent_into_it(make, fake) -> None:
    """Three replies to one chat at once, paced one a second: the first meets a 429, and the two
    waiting their turn behind it must not reach Telegram before its retry_after is over."""
    fake.keep_flood_waits()
    channel = await make(rate_private_per_s=1)
    await channel.send(reply(PRIVATE, "warm-up"))  # the chat's burst spent: the next ones are paced
    await channel.send(reply(PRIVATE, "warm-up 2"))
    await channel.send(reply(PRIVATE, "warm-up 3"))
    fake.fail_next("sendMessage", "429", retry_after=30)
    outcomes = await asyncio.gather(
        *(channel.send(Outbound(thread=PRIVATE, text=f"reply {n}", key=f"r{n}")) for n in range(3)),
        return_exceptions=True,
    )
    assert all(isinstance(o, ChannelError) and o.retry_after and o.retry_after > 25 for o in outcomes), outcomes
    assert fake.flood_violations == []
    assert len(fake.calls_to("sendMessage")) == 4  # the warm-ups and the one that met the 429


async def test_a_failure_part_way_carries_the_parts_posted_and_a_retry_skips_them(make, fake) -> None:
    channel = await make()
    text = "\n\n".join(f"Paragraph {n} " + "lorem ipsum " * 40 for n in range(30))
    fake.fail_next("sendMessage", "429", retry_after=1, after=1)
    with pytest.raises(ChannelError) as caught:
        await channel.send(reply(PRIVATE, text))
    (first,) = fake.bot_messages(42)
    assert caught.value.delivered == (str(first.message_id),)
    delivered = await channel.send(reply(PRIVATE, text, already=caught.value.delivered))
    shown = fake.bot_messages(42)
    assert delivered.message_ids == tuple(str(m.message_id) for m in shown)
    assert len({m.text for m in shown}) == len(shown)


async def test_rejected_formatting_is_resent_as_plain_text(make, fake) -> None:
    channel = await make()
    fake.fail_next("sendMessage", "parse")
    await channel.send(reply(PRIVATE, "**bold** move"))
    formatted, plain = fake.calls_to("sendMessage")
    assert formatted.params.get("entities") and "entities" not in plain.params
    assert [m.text for m in fake.bot_messages(42)] == ["bold move"]


async def test_server_errors_are_transient_channel_errors(make, fake) -> None:
    channel = await make()
    fake.fail_next("sendMessage", "500")
    with pytest.raises(ChannelError) as caught:
        await channel.send(reply(GROUP, "hello"))
    assert not caught.value.permanent and not caught.value.ambiguous
    assert len(fake.calls_to("sendMessage")) == 1 and fake.bot_messages(-100) == []


async def test_a_timed_out_send_is_ambiguous_and_a_timed_out_edit_is_not(make, fake) -> None:
    channel = await make(request_timeout_s=0.3)
    fake.timeout_delay_s = 1.0
    fake.fail_next("sendMessage", "timeout")
    with pytest.raises(ChannelError) as caught:
        await channel.send(reply(GROUP, "hello"))
    assert caught.value.ambiguous and [m.text for m in fake.bot_messages(-100)] == ["hello"]
    stream = channel.open_stream(GROUP)
    await stream.finish("first")
    fake.fail_next("editMessageText", "timeout")
    with pytest.raises(ChannelError) as edit:
        await stream.finish("second")
    assert not edit.value.ambiguous


async def test_unknown_chat_is_a_permanent_error(make, fake) -> None:
    channel = await make()
    with pytest.raises(ChannelError) as caught:
        await channel.send(reply(ThreadKey("telegram", "404"), "hello"))
    assert caught.value.permanent and "chat not found" in str(caught.value).lower()
    with pytest.raises(ChannelError):
        await channel.send(reply(ThreadKey("telegram", "not-a-number"), "hello"))


async def test_empty_text_is_never_sent_but_documents_are(make, fake) -> None:
    channel = await make()
    assert (await channel.send(reply(PRIVATE, "  \n "))).message_ids == ()
    delivered = await channel.send(reply(PRIVATE, "", document=("report.txt", "full text")))
    assert fake.calls_to("sendMessage") == []
    (document,) = fake.bot_messages(42)
    assert delivered.message_ids == (str(document.message_id),)
    assert document.document["file_name"] == "report.txt" and document.document["content"] == b"full text"


# --- prompts ----------------------------------------------------------------------------

APPROVE_ROWS = (
    (Button("✅ Approve", "a:1:y"), Button("❌ Deny", "a:1:n")),
    (Button("⏱ Allow 15 min", "a:1:t"), Button("🔁 Allow in this chat", "a:1:c")),
)


async def test_approval_prompt_shows_tool_arguments_and_buttons(make, fake) -> None:
    channel = await make()
    arguments = json.dumps({"command": "ls -la", "cwd": "/tmp"}, indent=2)
    prompt = Prompt("approval", GROUP, "p1", "Run a shell command", APPROVE_ROWS, "shell", arguments)
    delivered = await channel.send_prompt(prompt)
    (message,) = fake.bot_messages(-100)
    assert delivered.message_ids == (str(message.message_id),)
    assert "Run a shell command" in message.text and "shell" in message.text and '"ls -la"' in message.text
    pre = next(e for e in message.entities if e["type"] == "pre")
    assert pre["language"] == "json"
    labels = [[(b["text"], b["callback_data"]) for b in row] for row in message.buttons]
    assert labels == [[(b.label, b.token) for b in row] for row in APPROVE_ROWS]


async def test_long_arguments_are_truncated_and_attached_in_full(make, fake) -> None:
    channel = await make()
    arguments = json.dumps({"content": "x" * 5000, "path": "notes.txt"}, indent=2)
    prompt = Prompt("approval", PRIVATE, "p2", "Write a file", APPROVE_ROWS, "write_file", arguments)
    delivered = await channel.send_prompt(prompt)
    text_message, document = fake.bot_messages(42)
    assert delivered.message_ids == (str(text_message.message_id), str(document.message_id))
    assert utf16_len(text_message.text) < 4096
    hidden = int(re.search(r"… (\d+) characters", text_message.text).group(1))
    assert 0 < hidden < len(arguments)
    # its head and its tail are shown: what a long argument hides at its end is what a decider must see
    assert arguments[:40] in text_message.text and arguments[-30:] in text_message.text
    assert document.document["content"].decode() == arguments
    assert document.document["file_name"] == "write_file.json"
    assert text_message.buttons and not document.reply_markup


async def test_question_prompt_has_choices_and_hint(make, fake) -> None:
    channel = await make()
    rows = ((Button("Red", "q:9:0"),), (Button("Blue", "q:9:1"),))
    await channel.send_prompt(Prompt("question", TOPIC, "p3", "Which **colour**?", rows, hint="or type your answer"))
    (message,) = fake.bot_messages(-100)
    assert message.text == "❓ Which colour?\n\nor type your answer"
    assert message.thread_id == 7
    assert [[b["callback_data"] for b in row] for row in message.buttons] == [["q:9:0"], ["q:9:1"]]


async def test_closing_a_prompt_removes_buttons_and_shows_the_outcome_once(make, fake) -> None:
    channel = await make()
    prompt = Prompt("approval", GROUP, "p4", "Run it", APPROVE_ROWS, "shell", '{"command": "ls"}')
    delivered = await channel.send_prompt(prompt)
    await channel.close_prompt(GROUP, delivered.message_ids, "✅ Approved by Ann")
    await channel.close_prompt(GROUP, delivered.message_ids, "✅ Approved by Ann")
    (message,) = fake.bot_messages(-100)
    assert message.buttons == [] and message.text.endswith("\n\n✅ Approved by Ann")
    assert message.text.count("Approved by") == 1
    assert any(e["type"] == "pre" for e in message.entities)  # the formatting survived


async def test_oversized_button_tokens_are_refused(make, fake) -> None:
    channel = await make()
    rows = ((Button("Go", "x" * 65),),)
    with pytest.raises(ChannelError, match="64"):
        await channel.send_prompt(Prompt("question", PRIVATE, "p5", "Go?", rows))
    assert fake.calls_to("sendMessage") == []


# --- streaming --------------------------------------------------------------------------


async def test_private_chats_stream_with_drafts_then_send_the_final_message(make, fake) -> None:
    channel = await make(edit_interval_s=0)
    stream = channel.open_stream(PRIVATE)
    for text in ("Hel", "Hello **wor", "Hello **world**"):
        await stream.update(text)
    delivered = await stream.finish("Hello **world**!")
    assert fake.drafts[42] == ["Hel", "Hello **wor", "Hello world"]
    draft_ids = {c.params["draft_id"] for c in fake.calls_to("sendMessageDraft")}
    assert len(draft_ids) == 1 and draft_ids != {"0"}
    (message,) = fake.bot_messages(42)
    assert message.text == "Hello world!" and delivered.message_ids == (str(message.message_id),)
    assert fake.calls_to("editMessageText") == []


@pytest.mark.parametrize("setting, sent", [
    ("keep", {"can_stop": "true", "keep_on_stop": "true"}),
    ("discard", {"can_stop": "true", "keep_on_stop": "false"}),
    ("off", {}),
])
async def test_drafts_carry_the_stop_button_as_set(make, fake, setting, sent) -> None:
    channel = await make(edit_interval_s=0, stop_button=setting)
    stream = channel.open_stream(PRIVATE)
    await stream.update("Hello")
    (call,) = fake.calls_to("sendMessageDraft")
    assert {k: str(v).lower() for k, v in call.params.items() if k in ("can_stop", "keep_on_stop")} == sent


@pytest.mark.parametrize("setting, kept", [("keep", ["Hello wor"]), ("discard", [])])  # the latest, rendered
async def test_a_stopped_draft_is_posted_only_with_keep(make, fake, setting, kept) -> None:
    """Stop pressed on the draft (its update marks it), then the turn lets go of the stream."""
    channel = await make(edit_interval_s=0, stop_button=setting)
    stream = channel.open_stream(PRIVATE)
    await stream.update("Hello *wor")
    channel._drafts.stop(stream.draft_id)  # what ingesting its stopped_message_generation does
    stream.note("Hello **wor**")
    await stream.abort()
    assert [m.text for m in fake.bot_messages(42)] == kept


async def test_a_draft_aborted_without_a_stop_leaves_nothing(make, fake) -> None:
    channel = await make(edit_interval_s=0)
    stream = channel.open_stream(PRIVATE)
    await stream.update("Calling a tool")
    await stream.abort()  # a round that ends in tool calls, or /stop typed
    assert fake.bot_messages(42) == []


TABLE_REPLY = "Prices:\n\n| item | price |\n|---|---:|\n| tea | 2 |\n| cake | 4 |\n"


@pytest.mark.parametrize("setting, reply, rich", [
    ("on", TABLE_REPLY, True),
    ("on", "# Plan\n\nFirst this, then that.", True),
    ("on", "word " * 1000, True),  # several plain messages: one rich one
    ("on", "A short plain answer.", False),
    ("off", TABLE_REPLY, False),
])
async def test_rich_messages_go_only_where_they_are_on_and_worth_it(make, fake, setting, reply, rich) -> None:
    channel = await make(edit_interval_s=0, rich_messages=setting)
    stream = channel.open_stream(PRIVATE)
    delivered = await stream.finish(reply)
    sent = fake.calls_to("sendRichMessage")
    if rich:
        (call,) = sent
        assert call.params["rich_message"] == {"markdown": reply} and not fake.calls_to("sendMessage")
        assert delivered.message_ids == (str(fake.bot_messages(42)[0].message_id),)
    else:
        assert sent == [] and fake.calls_to("sendMessage")


async def test_a_refused_rich_message_goes_as_plain_messages(make, fake) -> None:
    channel = await make(rich_messages="on")
    fake.refuse_rich = "RICH_VALIDATE_CTOR_NOT_ALLOWED"
    delivered = await channel.send(Outbound(GROUP, TABLE_REPLY, key="r1", reply_to="7"))
    assert len(fake.calls_to("sendRichMessage")) == 1
    (message,) = fake.bot_messages(-100)
    assert "tea" in message.text and message.rich is None and message.reply_to == 7
    assert delivered.message_ids == (str(message.message_id),)


async def test_a_rich_reply_with_a_link_that_may_not_preview_goes_as_plain_messages(make, fake) -> None:
    """A rich message has no link_preview_options: with link_previews: own, a link the person
    did not send keeps the reply plain (and its preview off)."""
    channel = await make(rich_messages="on")
    text = TABLE_REPLY + "\nSee [the menu](https://cafe.example/menu?q=secret)."
    await channel.send(Outbound(GROUP, text, key="r2"))
    assert fake.calls_to("sendRichMessage") == []
    (call,) = fake.calls_to("sendMessage")
    assert call.params["link_preview_options"] == {"is_disabled": True}
    own = links_in("the menu is at https://cafe.example/menu?q=secret")  # as the turn hands them over
    await channel.send(Outbound(GROUP, text, key="r3", links=own))
    assert len(fake.calls_to("sendRichMessage")) == 1


async def test_group_edits_are_throttled_per_chat(make, fake) -> None:
    channel = await make(edit_interval_s=0.3)
    stream = channel.open_stream(GROUP, reply_to="5")
    await asyncio.sleep(0.35)  # the first update is due an interval after the stream opened
    for n in range(1, 6):
        await stream.update("word " * n)
    assert len(fake.calls_to("sendMessage")) == 1 and fake.calls_to("editMessageText") == []
    await stream.finish("word " * 6 + "done")
    (message,) = fake.bot_messages(-100)
    assert message.text == "word " * 6 + "done" and message.reply_to == 5
    assert len(fake.calls_to("editMessageText")) == 1
    assert fake.drafts == {}


@pytest.mark.parametrize("chat", [PRIVATE, GROUP])
async def test_a_reply_finished_within_the_interval_is_one_send_and_nothing_else(make, fake, chat) -> None:
    channel = await make(edit_interval_s=3600)
    stream = channel.open_stream(chat)
    for text in ("Hel", "Hello wor", "Hello world"):
        await stream.update(text)
    await stream.finish("Hello world!")
    assert [c.method for c in fake.calls if c.method.startswith(("send", "edit"))] == ["sendMessage"]


async def test_typing_waits_for_a_turn_that_takes_a_while(make, fake) -> None:
    channel = await make(typing_after_s=0.3)
    channel.typing_interval_s = 0.02
    await channel.set_busy(PRIVATE, True)
    await asyncio.sleep(0.2)
    await channel.set_busy(PRIVATE, False)  # answered quickly: no "typing" at all
    assert fake.calls_to("sendChatAction") == []
    await channel.set_busy(PRIVATE, True)
    await asyncio.wait_for(_until(lambda: len(fake.calls_to("sendChatAction")) >= 1), 5)
    await channel.set_busy(PRIVATE, False)


async def test_group_stream_edits_as_it_grows_and_adds_messages_at_the_end(make, fake) -> None:
    channel = await make(edit_interval_s=0)
    stream = channel.open_stream(TOPIC)
    await stream.update("first")
    await stream.update("first second")
    await stream.update("first second")  # unchanged: no call
    long_text = "\n\n".join("paragraph " + "x" * 1000 for _ in range(6))
    delivered = await stream.finish(long_text)
    sent = fake.bot_messages(-100)
    assert len(sent) >= 2 and delivered.message_ids == tuple(str(m.message_id) for m in sent)
    assert len(fake.calls_to("editMessageText")) == 2  # "first second", then the final first chunk
    assert all(m.thread_id == 7 for m in sent)


async def test_message_not_modified_counts_as_success(make, fake) -> None:
    channel = await make(edit_interval_s=0)
    stream = channel.open_stream(GROUP)
    await stream.update("partial")
    fake.fail_next("editMessageText", "not_modified")
    delivered = await stream.finish("complete")
    assert len(delivered.message_ids) == 1


async def test_streaming_off_and_edit_modes(make, fake) -> None:
    quiet = await make(streaming="off", edit_interval_s=0)
    stream = quiet.open_stream(PRIVATE)
    await stream.update("partial")
    await stream.finish("final")
    assert [c.method for c in fake.calls if c.method.startswith(("send", "edit"))] == ["sendMessage"]

    edits = await make(streaming="edit", edit_interval_s=0)
    stream = edits.open_stream(ThreadKey("telegram", "43"))
    await stream.update("partial")
    await stream.finish("final")
    assert fake.drafts == {} and [m.text for m in fake.bot_messages(43)] == ["final"]


async def test_typing_is_refreshed_until_the_turn_ends(make, fake) -> None:
    channel = await make(typing_after_s=0)
    channel.typing_interval_s = 0.02
    await channel.set_busy(TOPIC, True)
    await channel.set_busy(TOPIC, True)  # already busy: still one refresher
    await asyncio.wait_for(_until(lambda: len(fake.calls_to("sendChatAction")) >= 3), 5)
    await channel.set_busy(TOPIC, False)
    count = len(fake.calls_to("sendChatAction"))
    await asyncio.sleep(0.1)
    assert len(fake.calls_to("sendChatAction")) == count
    action = fake.calls_to("sendChatAction")[0].params
    assert (action["action"], action["message_thread_id"]) == ("typing", "7")


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.01)
