"""The event-loop lag monitor notices a loop that was held up."""

from __future__ import annotations

import asyncio
import time

from gateway.serving.loop_lag import LoopLag


async def test_a_blocked_loop_shows_as_lag() -> None:
    lag = LoopLag(interval_s=0.01)
    lag.start()
    try:
        await asyncio.sleep(0.05)
        assert lag.worst() < 0.2
        time.sleep(0.25)  # a callback that holds the loop
        await asyncio.sleep(0.05)
        assert lag.worst() >= 0.2
        assert lag.quantile(0.5) < 0.2  # one late tick among many on time
    finally:
        await lag.stop()
