"""A platform's flood wait holds the chat for every sender: the process told, another instance
(told through the database, at once on PostgreSQL by NOTIFY) and a process started after it.

Telegram answers 429 with `retry_after` to the bot, not to one process; a hold kept in one
process's memory let other instances, the sweeper and a restarted gateway send into a chat
Telegram had asked us to leave alone.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
from fakes.telegram import FakeTelegram
from test_outbox_delivery import CHAT, ScriptedChannel, VirtualTime
from test_telegram_e2e import PRIVATE, running, tg_config

from gateway.delivery.outbox import Outbox
from gateway.delivery.pacing import HOLDS_STALE_S, ChatPacer, RetryPolicy
from gateway.events import ChannelError, ThreadKey, utcnow
from gateway.store import Store


def shared_outbox(store, channel, virtual: VirtualTime) -> Outbox:  # noqa: ANN001
    pacer = ChatPacer(clock=virtual.clock, sleep=virtual.sleep, shared=store.holds)
    return Outbox(store, {channel.name: channel}, pacer=pacer, policy=RetryPolicy())


async def test_a_flood_wait_is_honoured_by_a_process_started_after_it(store) -> None:
    told = ScriptedChannel([ChannelError("Too Many Requests: retry after 300", retry_after=300)])
    first = shared_outbox(store, told, VirtualTime())
    sending = asyncio.create_task(first.send_text(CHAT, "held reply", key="k1"))
    await until_held(store, CHAT)
    sending.cancel()  # the process stops while it waits the hold out

    virtual = VirtualTime()
    restarted = shared_outbox(store, ScriptedChannel([]), virtual)
    await restarted.pacer.refresh()  # what a start does first
    assert 290 < restarted.pacer.held_for(CHAT) <= 300
    await restarted.send_text(CHAT, "another message", key="k2")
    assert len(virtual.sleeps) == 1 and 290 < virtual.sleeps[0] <= 300  # sent only after the hold
    other = ThreadKey("fake", "another-chat", "")
    assert restarted.pacer.held_for(other) == 0


async def until_held(store, thread: ThreadKey) -> None:  # noqa: ANN001
    async with asyncio.timeout(10):
        while f"{thread.channel}:{thread.chat}" not in await store.holds.active():
            await asyncio.sleep(0.02)


@pytest.fixture
async def second_store(store, db_kind):  # noqa: ANN001, ANN201
    if db_kind != "postgres":
        pytest.skip("several instances share PostgreSQL")
    other = Store(store.db.url, pg_schema=store.db.pg_schema)
    yield other
    await other.close()


async def test_a_flood_wait_met_by_one_instance_holds_the_chat_for_another(
    store, second_store, llm, tg: FakeTelegram, tmp_path
) -> None:
    """Instance a's send meets Telegram's 429; instance b, asked to send into the same chat
    right after, waits the hold out too (told by NOTIFY, well before its periodic read)."""
    config = tg_config(llm, tg, tmp_path)
    thread = ThreadKey("telegram", str(PRIVATE), "")
    async with running(store, config, instance_id="a") as a, running(second_store, config, instance_id="b") as b:
        tg.fail_next("sendMessage", "429", retry_after=3)
        held_at = time.monotonic()
        first = asyncio.create_task(a.outbox.send_text(thread, "from a", key="a1"))
        async with asyncio.timeout(2):  # NOTIFY: well within HOLDS_REFRESH_S (5 s)
            while b.outbox.pacer.held_for(thread) == 0:
                await asyncio.sleep(0.02)
        await b.outbox.send_text(thread, "from b", key="b1")
        await first
    sent = {c.params["text"]: c.at for c in tg.calls_to("sendMessage") if c.params.get("text") in ("from a", "from b")}
    assert sent["from b"] - held_at >= 2.9 and sent["from a"] - held_at >= 2.9


async def test_a_stale_view_of_the_holds_is_read_again_before_a_send(store) -> None:
    """A hold written while this process could not hear of it (stopped, or its refreshes
    failing while the database restarted: the NOTIFY was lost) is read before its next send,
    not up to a refresh interval later."""
    virtual = VirtualTime()
    outbox = shared_outbox(store, ScriptedChannel([]), virtual)
    await outbox.pacer.refresh()  # current now
    await store.holds.hold(f"{CHAT.channel}:{CHAT.chat}", utcnow() + timedelta(seconds=60))  # unheard of
    virtual.now += HOLDS_STALE_S + 1  # its refreshes did not run since
    await outbox.send_text(CHAT, "a message", key="k-stale")
    assert len(virtual.sleeps) == 1 and 50 < virtual.sleeps[0] <= 60  # sent only after the hold
