"""The bot's overall send budget holds at the Bot API, not only where tokens are handed out."""

from __future__ import annotations

import asyncio
import time

from channels.telegram.api import BotCaller, Pacer

RATE = 20.0  # overall sends per second (the bucket's burst is the same)


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
    assert most <= RATE + RATE * window + 1  # a full bucket, then the rate
