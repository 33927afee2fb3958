"""The outbox as the one retry layer: chat holds for retry_after, backoff with jitter,
ambiguous sends recorded, and the same through the real Telegram channel."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from fakes.channel import FakeChannel
from fakes.telegram import FakeTelegram
from fakes.telegram_core import RecordingCore

from channels.telegram import TelegramChannel
from gateway.config import TelegramConfig
from gateway.delivery.outbox import AMBIGUOUS_GAVE_UP, AMBIGUOUS_RESENT, Outbox
from gateway.delivery.pacing import ChatPacer, RetryPolicy
from gateway.events import Button, ChannelError, Delivered, Outbound, Prompt, ThreadKey, utcnow

CHAT = ThreadKey("fake", "c1", "")
TG_CHAT = ThreadKey("telegram", "42", "")


@dataclass
class VirtualTime:
    """A clock the pacer and the backoff share: sleeping advances it at once."""

    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)
    asleep: asyncio.Event = field(default_factory=asyncio.Event)

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.asleep.set()
        await asyncio.sleep(0.05)  # long enough for a test to look at the outbox row meanwhile
        self.now += seconds


class ScriptedChannel(FakeChannel):
    """Fails sends as scripted (a list of ChannelErrors, then success), timing each attempt."""

    def __init__(self, failures: list[ChannelError]) -> None:
        super().__init__(name="fake")
        self.failures = list(failures)
        self.attempts: list[float] = []

    async def send(self, message: Outbound) -> Delivered:
        self.attempts.append(time.monotonic())
        if self.failures:
            raise self.failures.pop(0)
        return await super().send(message)


def outbox_for(store, channel, *, time_source: VirtualTime | None = None, policy: RetryPolicy | None = None) -> Outbox:
    pacer = ChatPacer(clock=time_source.clock, sleep=time_source.sleep) if time_source else ChatPacer()
    return Outbox(store, {channel.name: channel}, pacer=pacer, policy=policy or RetryPolicy())


async def test_retry_after_holds_the_chat_before_the_next_attempt(sqlite_store) -> None:
    channel = ScriptedChannel([ChannelError("flood", retry_after=0.5)])
    outbox = outbox_for(sqlite_store, channel)

    await outbox.send_text(CHAT, "hello", key="k1")

    first, second = channel.attempts
    assert second - first >= 0.5
    assert channel.messages() == ["hello"]
    row = await sqlite_store.outbox.get("k1")
    assert row.status == "sent" and row.attempts == 2


async def test_a_flood_wait_of_minutes_is_waited_out_and_shown_on_the_row(sqlite_store) -> None:
    virtual = VirtualTime()
    channel = ScriptedChannel([ChannelError("flood", retry_after=150)])
    outbox = outbox_for(sqlite_store, channel, time_source=virtual)

    sending = asyncio.create_task(outbox.send_text(CHAT, "after the wait", key="k1"))
    await asyncio.wait_for(virtual.asleep.wait(), 5)
    waiting = await sqlite_store.outbox.get("k1")
    assert waiting.status == "pending" and waiting.retry_at is not None
    assert timedelta(seconds=140) < waiting.retry_at - utcnow() <= timedelta(seconds=150)
    assert outbox.pacer.held_for(CHAT) > 140
    assert [r.key for r in await sqlite_store.outbox.undelivered(str(CHAT))] == ["k1"]

    await asyncio.wait_for(sending, 5)
    assert virtual.sleeps == [150]
    assert channel.messages() == ["after the wait"]
    assert (await sqlite_store.outbox.get("k1")).status == "sent"


async def test_a_hold_also_delays_other_messages_to_that_chat(sqlite_store) -> None:
    virtual = VirtualTime()
    channel = ScriptedChannel([])
    outbox = outbox_for(sqlite_store, channel, time_source=virtual)
    await outbox.pacer.hold(CHAT, 40)

    await outbox.send_text(CHAT, "later", key="k1")
    await outbox.send_text(ThreadKey("fake", "other", ""), "at once", key="k2")

    assert virtual.sleeps == [40]
    assert channel.messages() == ["later", "at once"]


async def test_transient_failures_back_off_with_jitter_then_are_left_for_the_sweeper(sqlite_store) -> None:
    virtual = VirtualTime()
    channel = ScriptedChannel([ChannelError(f"HTTP 500 #{n}") for n in range(10)])
    outbox = outbox_for(
        sqlite_store, channel, time_source=virtual, policy=RetryPolicy(max_attempts=4, backoff_s=1, backoff_max_s=3)
    )

    with pytest.raises(ChannelError):
        await outbox.send_text(CHAT, "hello", key="k1")

    assert len(channel.attempts) == 4
    caps = [1, 2, 3]
    assert len(virtual.sleeps) == 3
    assert all(cap / 2 <= slept <= cap for slept, cap in zip(virtual.sleeps, caps, strict=True)), virtual.sleeps
    row = await sqlite_store.outbox.get("k1")
    assert row.status == "pending" and row.attempts == 4 and "HTTP 500 #3" in row.error


async def test_a_permanent_failure_is_not_retried(sqlite_store) -> None:
    channel = ScriptedChannel([ChannelError("chat not found", permanent=True)])
    outbox = outbox_for(sqlite_store, channel)
    with pytest.raises(ChannelError):
        await outbox.send_text(CHAT, "hello", key="k1")
    assert len(channel.attempts) == 1
    row = await sqlite_store.outbox.get("k1")
    assert row.status == "failed" and row.error == "chat not found"


# --- ambiguous sends -------------------------------------------------------------------


async def test_an_ambiguous_new_message_is_sent_again_once_and_the_decision_recorded(sqlite_store) -> None:
    channel = ScriptedChannel([ChannelError("timed out", ambiguous=True)])
    outbox = outbox_for(sqlite_store, channel)

    await outbox.send_text(CHAT, "hello", key="k1")

    assert len(channel.attempts) == 2 and channel.messages() == ["hello"]
    row = await sqlite_store.outbox.get("k1")
    assert row.status == "sent" and row.uncertain == AMBIGUOUS_RESENT
    assert [r.key for r in await sqlite_store.outbox.uncertain()] == ["k1"]


async def test_a_second_ambiguous_failure_is_not_sent_a_third_time(sqlite_store) -> None:
    channel = ScriptedChannel(
        [ChannelError("timed out", ambiguous=True), ChannelError("timed out again", ambiguous=True)]
    )
    outbox = outbox_for(sqlite_store, channel)

    with pytest.raises(ChannelError):
        await outbox.send_text(CHAT, "hello", key="k1")

    assert len(channel.attempts) == 2
    row = await sqlite_store.outbox.get("k1")
    assert row.status == "failed" and row.uncertain == AMBIGUOUS_GAVE_UP


async def test_the_one_resend_is_remembered_across_a_restart(sqlite_store) -> None:
    first = ScriptedChannel([ChannelError("timed out", ambiguous=True), ChannelError("refused")])
    with pytest.raises(ChannelError):
        await outbox_for(sqlite_store, first, policy=RetryPolicy(max_attempts=1)).send_text(CHAT, "hello", key="k1")
    # Another process picks the row up: the one resend was used, a new timeout ends it.
    second = ScriptedChannel([ChannelError("timed out", ambiguous=True)])
    with pytest.raises(ChannelError):
        await outbox_for(sqlite_store, second).send_text(CHAT, "hello", key="k1")
    assert len(second.attempts) == 1
    assert (await sqlite_store.outbox.get("k1")).uncertain == AMBIGUOUS_GAVE_UP


# --- through the real Telegram channel ------------------------------------------------------


@pytest.fixture
async def telegram() -> AsyncIterator[tuple[FakeTelegram, TelegramChannel]]:
    async with FakeTelegram() as fake:
        config = TelegramConfig(
            token=fake.token,
            api_base_url=fake.base_url,
            rate_private_per_s=0,
            rate_group_per_min=0,
            request_timeout_s=0.5,
            edit_interval_s=0,  # a stream shows its first chunk at once: these tests time it out
        )
        channel = TelegramChannel(config, RecordingCore())
        await channel.start(RecordingCore().submit)
        try:
            yield fake, channel
        finally:
            await channel.stop()


async def test_a_telegram_flood_wait_longer_than_a_minute_still_delivers(sqlite_store, telegram) -> None:
    fake, channel = telegram
    virtual = VirtualTime()
    outbox = Outbox(
        sqlite_store, {"telegram": channel}, pacer=ChatPacer(clock=virtual.clock, sleep=virtual.sleep)
    )
    fake.fail_next("sendMessage", "429", retry_after=75)

    await outbox.send_text(TG_CHAT, "hello", key="k1")

    assert len(fake.calls_to("sendMessage")) == 2
    assert virtual.sleeps == [75]
    assert [m.text for m in fake.bot_messages(42)] == ["hello"]


async def test_telegram_failures_are_retried_by_the_outbox_alone(sqlite_store, telegram) -> None:
    fake, channel = telegram
    for _ in range(10):
        fake.fail_next("sendMessage", "500")
    virtual = VirtualTime()
    outbox = Outbox(
        sqlite_store,
        {"telegram": channel},
        pacer=ChatPacer(clock=virtual.clock, sleep=virtual.sleep),
        policy=RetryPolicy(max_attempts=3),
    )
    with pytest.raises(ChannelError):
        await outbox.send_text(TG_CHAT, "hello", key="k1")
    assert len(fake.calls_to("sendMessage")) == 3  # not 3 retries inside each of 3 attempts


async def test_a_long_telegram_reply_continues_after_the_parts_already_posted(sqlite_store, telegram) -> None:
    fake, channel = telegram
    text = "\n\n".join(f"Paragraph {n} " + "lorem ipsum " * 40 for n in range(30))
    fake.fail_next("sendMessage", "500", after=1)  # the first part goes out, the second fails
    virtual = VirtualTime()
    outbox = Outbox(
        sqlite_store, {"telegram": channel}, pacer=ChatPacer(clock=virtual.clock, sleep=virtual.sleep)
    )

    delivered = await outbox.send_text(TG_CHAT, text, key="k1")

    shown = fake.bot_messages(42)
    assert len(shown) >= 3 and delivered.message_ids == tuple(str(m.message_id) for m in shown)
    assert len({m.text for m in shown}) == len(shown)  # no part twice


async def test_a_telegram_send_that_times_out_after_delivery_is_recorded_uncertain(sqlite_store, telegram) -> None:
    fake, channel = telegram
    fake.timeout_delay_s = 1.5
    fake.fail_next("sendMessage", "timeout")
    outbox = Outbox(sqlite_store, {"telegram": channel})

    await outbox.send_text(TG_CHAT, "hello", key="k1")

    assert len(fake.calls_to("sendMessage")) == 2  # the one resend
    row = await sqlite_store.outbox.get("k1")
    assert row.status == "sent" and row.uncertain == AMBIGUOUS_RESENT


async def test_the_first_message_of_a_streamed_reply_timing_out_is_recorded_and_resent_once(
    sqlite_store, telegram
) -> None:
    fake, channel = telegram
    fake.timeout_delay_s = 1.5
    fake.fail_next("sendMessage", "timeout")  # the stream's first message is posted, the answer comes too late
    group = ThreadKey("telegram", "-100", "")
    outbox = Outbox(sqlite_store, {"telegram": channel})
    stream = outbox.stream(group, progress_key="partial:1")

    await stream.update("Answer to M00001: the")
    await stream.update("Answer to M00001: the fake model")  # would post it again without a message id
    await stream.finish("reply:1", "Answer to M00001: the fake model has answered.")

    assert len(fake.calls_to("sendMessage")) == 2  # the timed-out one and its one resend, nothing more
    assert [m.text for m in fake.bot_messages(-100)][-1] == "Answer to M00001: the fake model has answered."
    row = await sqlite_store.outbox.get("reply:1")
    assert row.status == "sent" and row.uncertain == AMBIGUOUS_RESENT
    assert [r.key for r in await sqlite_store.outbox.uncertain()] == ["reply:1"]


async def test_a_timed_out_streamed_message_is_recorded_uncertain_at_once_and_carried_over(
    sqlite_store, telegram
) -> None:
    """Recorded when it times out, not only when the reply is delivered: a kill -9 before then
    leaves it listed, and the run that continues the reply resends it once, recorded as such."""
    fake, channel = telegram
    fake.timeout_delay_s = 1.5
    fake.fail_next("sendMessage", "timeout")
    group = ThreadKey("telegram", "-100", "")
    outbox = Outbox(sqlite_store, {"telegram": channel})

    await outbox.stream(group, progress_key="partial:1").update("Answer to M00003: the")

    row = await sqlite_store.outbox.get("partial:1")
    assert row.uncertain == AMBIGUOUS_RESENT and row.payload["text"] == "Answer to M00003: the"
    assert [r.key for r in await sqlite_store.outbox.uncertain()] == ["partial:1"]
    # The process dies here; the run that continues the reply adopts what the stream showed.
    adopted = await sqlite_store.outbox.adopt_partial("partial:1", "partial:2", str(group))
    assert adopted is not None and adopted.uncertain == AMBIGUOUS_RESENT
    again = outbox.stream(group, progress_key="partial:2", uncertain=True)
    await again.update("Answer to M00003: the fake")  # no progress: it could post it a third time
    await again.finish("reply:2", "Answer to M00003: the fake model has answered.")
    assert len(fake.calls_to("sendMessage")) == 2
    reply = await sqlite_store.outbox.get("reply:2")
    assert reply.status == "sent" and reply.uncertain == AMBIGUOUS_RESENT
    assert [r.key for r in await sqlite_store.outbox.uncertain()] == ["reply:2"]  # one case, listed once
    assert await sqlite_store.outbox.adopt_partial("partial:1", "partial:3", str(group)) is None  # adopted once


async def test_a_streamed_reply_whose_resend_times_out_too_is_not_sent_a_third_time(sqlite_store, telegram) -> None:
    fake, channel = telegram
    fake.timeout_delay_s = 1.5
    fake.fail_next("sendMessage", "timeout")
    fake.fail_next("sendMessage", "timeout")
    group = ThreadKey("telegram", "-100", "")
    stream = Outbox(sqlite_store, {"telegram": channel}).stream(group)

    await stream.update("Answer to M00002: the")
    with pytest.raises(ChannelError):
        await stream.finish("reply:2", "Answer to M00002: done.")

    assert len(fake.calls_to("sendMessage")) == 2
    row = await sqlite_store.outbox.get("reply:2")
    assert row.status == "failed" and row.uncertain == AMBIGUOUS_GAVE_UP


async def test_a_telegram_edit_that_times_out_is_retried_as_safe(sqlite_store, telegram) -> None:
    fake, channel = telegram
    fake.timeout_delay_s = 1.5
    buttons = ((Button("Approve", "tok.a"), Button("Deny", "tok.d")),)
    sent = await channel.send_prompt(Prompt("approval", TG_CHAT, "q", "Run shell?", buttons))
    fake.fail_next("editMessageReplyMarkup", "timeout")
    outbox = Outbox(sqlite_store, {"telegram": channel})

    await outbox.close_prompt("close:1", TG_CHAT, list(sent.message_ids), "✅ Approved")

    row = await sqlite_store.outbox.get("close:1")
    assert row.status == "sent" and row.uncertain is None and row.attempts >= 2


async def test_no_progress_goes_to_a_chat_the_platform_holds(sqlite_store) -> None:
    """A streamed reply's progress edits into a held chat were sent anyway (the platform refuses
    them and may lengthen the wait); the final text waits the hold out."""
    virtual = VirtualTime()
    channel = ScriptedChannel([])
    outbox = outbox_for(sqlite_store, channel, time_source=virtual)
    await outbox.pacer.hold(CHAT, 40)
    stream = outbox.stream(CHAT)
    await stream.update("the reply so fa")
    await stream.show(lambda: "the reply so far")
    assert channel.stream_updates == []
    await stream.finish("reply:1", "the whole reply")
    assert virtual.sleeps == [40]


async def test_a_delivery_is_recorded_once_the_database_is_back(sqlite_store, monkeypatch) -> None:
    """The database went away (a restart) just after the platform took the message: the write
    that records it is tried again, not given up (the turn that continued sent it again)."""
    channel = ScriptedChannel([])
    outbox = outbox_for(sqlite_store, channel)
    real, failures = sqlite_store.outbox.mark_sent, [ConnectionRefusedError(111, "Connect call failed")] * 2

    async def flaky(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        if failures:
            raise failures.pop()
        return await real(*args, **kwargs)

    monkeypatch.setattr(sqlite_store.outbox, "mark_sent", flaky)
    await outbox.send_text(CHAT, "posted while the database restarts", key="k1")
    assert channel.messages() == ["posted while the database restarts"]
    assert (await sqlite_store.outbox.get("k1")).status == "sent"
    await outbox.send_text(CHAT, "posted while the database restarts", key="k1")  # the turn continued
    assert channel.messages() == ["posted while the database restarts"]
