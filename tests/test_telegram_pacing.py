"""The bot's overall send budget holds at the Bot API, not only where tokens are handed out."""

from __future__ import annotations

import asyncio
import time

import pytest

from channels.telegram.api import BotCaller
from channels.telegram.pacing import SWEEP_FROM, Pacer, RollingWindow

RATE = 20.0  # overall sends per second (in any one second)


async def test_sends_queued_behind_a_slow_bot_api_do_not_leave_in_a_burst() -> None:
    # Two connections; the first two calls stall for a second (a slow or stalled Bot API). Calls
    # that took their token while waiting for a connection would then all go out at once, far
    # over the budget, the way Telegram counts it (when requests arrive).
    caller = BotCaller(Pacer(RATE, private_per_s=100, group_per_min=6000), connections=2)
    started: list[float] = []

    async def send(stall: float) -> None:
        started.append(time.monotonic())
        await asyncio.sleep(stall)

    calls = [caller.call("sendMessage", chat, lambda n=chat: send(1.0 if n <= 2 else 0.0)) for chat in range(1, 61)]
    await asyncio.gather(*calls)
    started.sort()
    after_stall = [t for t in started if t >= started[0] + 0.9]
    window = 0.5
    most = max(sum(1 for t in after_stall if s <= t < s + window) for s in after_stall)
    assert most <= RATE  # at most a second's worth in any second


class VirtualTime:
    """A clock that a sleep moves forward (nothing really waits)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)
        await asyncio.sleep(0)


def busiest(times: list[float], window: float) -> int:
    return max(sum(1 for t in times if s <= t < s + window) for s in times)


async def test_the_overall_budget_holds_in_every_second_not_only_on_average() -> None:
    # A token bucket of rate 30 and burst 30 lets 60 through in the second after a quiet spell.
    time_ = VirtualTime()
    window = RollingWindow(30, time_.clock, time_.sleep)
    sent: list[float] = []
    for _ in range(100):
        with await window.take():
            sent.append(time_.now)  # answered at once
    assert busiest(sent, 1.0) == 30
    assert sent[:30] == [sent[0]] * 30  # a quiet bot sends a second's worth at once
    assert sent[-1] - sent[0] == pytest.approx(3.0)  # then 30 a second: 100 sends span 3 s


async def test_a_send_counts_while_it_is_out_and_a_window_after_its_answer() -> None:
    # However late a taken send leaves (a busy loop), it arrives before its answer: counting it
    # from the answer keeps any second of arrivals within the limit.
    time_ = VirtualTime()
    window = RollingWindow(2, time_.clock, time_.sleep)
    first, second = await window.take(), await window.take()
    third = asyncio.create_task(window.take())
    await asyncio.sleep(0)
    time_.now += 5.0  # both still out, five seconds on: still counted
    await asyncio.sleep(0)
    assert not third.done() and not window.ready()
    with first:
        pass  # answered now
    slot = await third
    assert time_.now == pytest.approx(1006.0)  # one window after the answer
    with second, slot:
        pass


async def test_optional_calls_take_only_what_is_free_and_never_before_a_waiting_send() -> None:
    time_ = VirtualTime()
    window = RollingWindow(2, time_.clock, time_.sleep)
    with window.try_take() or pytest.fail("free"), window.try_take() or pytest.fail("free"):
        pass
    assert not window.ready() and window.try_take() is None  # two in this second already
    time_.now += 1.0
    assert window.ready()
    slow = RollingWindow(1, time_.clock, asyncio.sleep)  # a send that really waits holds the lock
    with await slow.take():
        pass
    waiting = asyncio.create_task(slow.take())
    await asyncio.sleep(0)
    time_.now += 1.0
    assert not slow.ready()  # free by the clock, but the waiting send goes first
    waiting.cancel()


async def test_a_fractional_rate_spaces_single_sends() -> None:
    time_ = VirtualTime()
    window = RollingWindow(0.5, time_.clock, time_.sleep)
    sent = []
    for _ in range(3):
        with await window.take():
            sent.append(time_.now)
    assert [b - a for a, b in zip(sent, sent[1:], strict=False)] == [2.0, 2.0]


async def test_chats_buckets_that_rested_are_forgotten() -> None:
    time_ = VirtualTime()
    pacer = Pacer(0, private_per_s=1.0, group_per_min=20, clock=time_.clock, sleep=time_.sleep)
    for chat in range(1, SWEEP_FROM + 1):
        await pacer.wait_chat(chat)  # each took a token: not rested yet
    await pacer.wait_chat(SWEEP_FROM + 1)  # the sweep finds none rested
    assert len(pacer._chats) == SWEEP_FROM + 1
    time_.now += 5.0  # every bucket is full again
    for chat in range(SWEEP_FROM + 2, 2 * SWEEP_FROM + 4):
        await pacer.wait_chat(chat)
    # The map doubled: the rested ones went, the ones busy in the last seconds stayed.
    assert min(pacer._chats) == SWEEP_FROM + 2 and len(pacer._chats) == SWEEP_FROM + 2
    for _ in range(3):
        await pacer.wait_chat(7)  # a forgotten chat starts with a full bucket: its burst of 3 at once
    assert time_.now == 1005.0


async def test_instances_sharing_the_bot_each_take_their_share_of_its_budget() -> None:
    # Three instances send for one bot: Telegram's 30 a second is the bot's, not each process's.
    time_ = VirtualTime()
    pacer = Pacer(30, private_per_s=0, group_per_min=0, clock=time_.clock, sleep=time_.sleep)
    pacer.share_among(3)
    sent: list[float] = []
    for _ in range(40):
        with await pacer.wait_overall():
            sent.append(time_.now)
    assert busiest(sent, 1.0) == 10  # a third of the bot's 30
    assert pacer.spare() is None  # drafts find nothing spare either
    pacer.share_among(1)  # the others stopped: the whole budget again
    sent.clear()
    time_.now += 2.0
    for _ in range(40):
        with await pacer.wait_overall():
            sent.append(time_.now)
    assert busiest(sent, 1.0) == 30
