"""Sends are fenced: a holder that stalled past its lease's time to live (a GC pause, a stopped
VM, SIGSTOP) neither sends nor records a send once another instance took the thread over.

The holder proves its lease before each send by its own clock (renewing on the spot when its
renewals have not run), and every write of a send carries the fence, so a stalled holder is
stopped at its first send after waking, not only at its next renewal. SQLite and PostgreSQL;
the SIGSTOP case with two real processes.
"""

from __future__ import annotations

import asyncio
import signal

import pytest
from fakes.channel import FakeChannel
from fakes.llm import Hold, Reply
from helpers import until
from test_subagents_crash import doomed_gateway
from test_telegram_e2e import PRIVATE, running, settle, texts, tg_config

from gateway.config import TracesConfig
from gateway.delivery import fencing
from gateway.delivery.outbox import Outbox
from gateway.events import ChannelError, Outbound, ThreadKey
from gateway.inbox.holder import LeaseHolder
from gateway.store import Fence, LeaseLost
from gateway.traces.runs import RunTrace

THREAD = ThreadKey("fake", "chat1", "")
LEASE = f"thread:{THREAD}"
# What changes what a chat shows; a woken holder may still poll or show "typing".
SHOWING = ("sendMessage", "sendMessageDraft", "editMessageText", "deleteMessage", "sendDocument", "sendPhoto")


async def take_over_after_expiry(store, ttl_s: float):  # noqa: ANN001, ANN201
    await asyncio.sleep(ttl_s * 1.5)
    taken = await store.inbox.acquire(LEASE, "survivor", 30)
    assert taken is not None and taken.taken_over
    return taken


async def in_task(work):  # noqa: ANN001, ANN201
    """`work` in a task of its own: the lease it holds is that task's, as for a worker."""
    return await asyncio.create_task(work)


async def test_a_holder_whose_lease_was_taken_over_while_it_stalled_does_not_send(store) -> None:
    channel = FakeChannel(name="fake")
    outbox = Outbox(store, {"fake": channel})
    lease = await store.inbox.acquire(LEASE, "stalls", 0.2)

    async def stalled_then_send() -> None:
        fencing.hold(LeaseHolder(store, lease, 0.2))  # its renewals never run: as under SIGSTOP
        await take_over_after_expiry(store, 0.2)
        await outbox.send_text(THREAD, "a late answer", key="reply:1")

    with pytest.raises(LeaseLost):
        await in_task(stalled_then_send())
    assert channel.messages(THREAD) == []
    assert await store.outbox.get("reply:1") is None  # not even recorded


async def test_a_send_recorded_before_the_stall_is_neither_sent_nor_marked_after_it(store) -> None:
    channel = FakeChannel(name="fake")
    outbox = Outbox(store, {"fake": channel})
    lease = await store.inbox.acquire(LEASE, "stalls", 0.2)
    holder = LeaseHolder(store, lease, 0.2)
    record = await store.outbox.record("reply:2", str(THREAD), "message", {"text": "answer"}, fence=holder.fence)

    async def stalled_then_deliver() -> None:
        fencing.hold(holder)
        await take_over_after_expiry(store, 0.2)
        await outbox.deliver_recorded(record, THREAD, lambda ch, _done: ch.send(Outbound(THREAD, "answer", "reply:2")))

    with pytest.raises(LeaseLost):
        await in_task(stalled_then_deliver())
    assert channel.messages(THREAD) == []
    assert (await store.outbox.get("reply:2")).status == "pending"  # the new holder delivers it, once


async def test_every_write_of_a_send_refuses_a_stale_fence(store) -> None:
    lease = await store.inbox.acquire(LEASE, "stalls", 0.1)
    stale = Fence(lease.name, lease.owner, lease.fence)
    record = await store.outbox.record("reply:3", str(THREAD), "message", {"text": "answer"}, fence=stale)
    await take_over_after_expiry(store, 0.1)
    writes = [
        store.outbox.record("reply:4", str(THREAD), "message", {"text": "x"}, fence=stale),
        store.outbox.mark_sent(record.id, ["9"], fence=stale),
        store.outbox.attempt_failed(record.id, "HTTP 502", final=False, fence=stale),
        store.outbox.remember_partial(record.id, ["9"], fence=stale),
        store.outbox.forget_partial(record.id, fence=stale),
    ]
    for write in writes:
        with pytest.raises(LeaseLost):
            await write
    row = await store.outbox.get("reply:3")
    assert (row.status, row.message_ids, row.attempts) == ("pending", [], 0)
    assert await store.outbox.get("reply:4") is None


async def test_a_fresh_lease_is_proven_without_asking_the_database(store) -> None:
    lease = await store.inbox.acquire(LEASE, "holds", 30)
    now = [0.0]
    holder = LeaseHolder(store, lease, 30, clock=lambda: now[0])
    await store.inbox.release(lease)  # were the database asked, the proof would fail
    assert await holder.prove() == holder.fence
    now[0] = 21  # past two thirds of the TTL without a renewal: asked, and found lost
    with pytest.raises(LeaseLost):
        await holder.prove()
    assert not holder.valid


async def test_a_sigstopped_holder_sends_nothing_after_a_second_instance_finished_its_turn(
    store, llm, tg, tmp_path
) -> None:
    """Two processes: the one running the turn is stopped with SIGSTOP past the lease's TTL
    mid-reply; the survivor continues the run and answers; the stalled one, woken with its
    reply's stream ready to go on, must not touch the chat again."""
    held = Hold("The stalled holder's ", Reply("answer, sent late."))
    llm.push(held)
    ttl = 3
    config = tg_config(llm, tg, tmp_path, inbox={"lease_ttl_s": ttl}, serve={"instance_id": "stalls"})
    async with doomed_gateway("telegram", store, config, tmp_path) as (process, _port):
        tg.private_message(PRIVATE, "what is the answer?")
        await asyncio.wait_for(llm.stalled.wait(), 30)
        # Stopped once it has shown all the held text: a draft still on its way when the signal
        # lands (begun before the stall) would reach the chat after SIGCONT, and is not the case.
        await until(lambda: any("stalled holder's" in str(c.params) for c in tg.calls if c.method in SHOWING), 10)
        process.send_signal(signal.SIGSTOP)
        try:
            await asyncio.sleep(ttl + 1.5)
            llm.reply("The survivor's answer.")
            async with running(store, config, instance_id="survivor") as gateway:
                await settle(gateway, lambda: "The survivor's answer." in texts(tg, PRIVATE))
                woken = len(tg.calls)
                held.released.set()  # the stalled stream's next chunks wait in its socket
                await asyncio.sleep(0.3)
                process.send_signal(signal.SIGCONT)
                await asyncio.sleep(ttl)  # the woken holder's sends, if any, come now
        finally:
            process.send_signal(signal.SIGCONT)
    # Told apart by their text: the survivor's stream may still show a late draft of its own.
    late = [c.method for c in tg.calls[woken:] if c.method in SHOWING and "stalled holder" in str(c.params)]
    assert late == []
    assert texts(tg, PRIVATE) == ["The survivor's answer."]


class StallingChannel(FakeChannel):
    """A send that is carried out, then hangs (the sender stopped mid-request) and times out."""

    def __init__(self) -> None:
        super().__init__(name="fake")
        self.carried_out = asyncio.Event()
        self.wake = asyncio.Event()

    async def send(self, message):  # noqa: ANN001, ANN201
        await super().send(message)
        self.carried_out.set()
        await self.wake.wait()
        raise ChannelError("Timed out", ambiguous=True)


async def test_a_send_cut_by_a_stall_is_recorded_as_possibly_delivered(store) -> None:
    """The holder's request reached the platform, then it stalled past the TTL: its record of
    the timeout is refused (fenced), but the ambiguity is written on the row, so the new
    holder's answer beside it is a listed ambiguous send, not an unexplained duplicate."""
    channel = StallingChannel()
    outbox = Outbox(store, {"fake": channel})
    lease = await store.inbox.acquire(LEASE, "stalls", 0.2)
    holder = LeaseHolder(store, lease, 0.2)

    async def send() -> None:
        fencing.hold(holder)
        await outbox.send_text(THREAD, "an answer", key="reply:5")

    sending = asyncio.create_task(send())
    await asyncio.wait_for(channel.carried_out.wait(), 5)
    await take_over_after_expiry(store, 0.2)
    channel.wake.set()
    with pytest.raises(LeaseLost):
        await sending
    row = await store.outbox.get("reply:5")
    assert row.status == "pending" and row.uncertain and "lost the thread" in row.uncertain
    assert [r.key for r in await store.outbox.uncertain()] == ["reply:5"]


async def test_a_reply_found_delivered_finishes_its_run_through_the_runs_trace_fenced(store) -> None:
    """A continued run whose reply another sender already delivered (the sweeper, say) sends
    nothing and ends SUCCESS in its trace's own fenced write; a holder that lost the thread
    meanwhile ends nothing (the stage stays for the new holder)."""
    channel = FakeChannel(name="fake")
    outbox = Outbox(store, {"fake": channel})
    session = await store.sessions.open(str(THREAD), source="fake")
    for owner, lost in (("keeps", False), ("loses", True)):
        run = await store.runs.start(session.id, str(THREAD))
        lease = await store.inbox.acquire(LEASE, owner, 30)
        fence = Fence(lease.name, lease.owner, lease.fence)
        key = f"reply:{run.id}"
        record = await store.outbox.record(key, str(THREAD), "message", {"text": "answer"}, fence=fence)
        await store.outbox.mark_sent(record.id, ["7"], fence=fence)  # delivered, the run not finished
        record = await store.outbox.get(key)
        if lost:
            await store.inbox.release(lease)
            await store.inbox.acquire(LEASE, "survivor", 30)
        trace = RunTrace(store, run.id, config=TracesConfig(), prices={}, fence=fence)
        stream = outbox.stream(THREAD, "1")

        async def finish(trace=trace, stream=stream, record=record) -> None:  # noqa: ANN001
            await trace.end_with("SUCCESS", "reply", lambda final: stream.deliver(record, "answer", final_stage=final))

        if lost:
            with pytest.raises(LeaseLost):
                await finish()
            assert (await store.runs.get(run.id)).stage == "RUNNING"
            await store.inbox.release(await store.inbox.acquire(LEASE, "survivor", 30))
        else:
            await finish()
            assert (await store.runs.get(run.id)).stage == "SUCCESS"
            await store.inbox.release(lease)
    assert channel.messages(THREAD) == []
