"""A per-conversation pacer: Slack allows about one message a second per channel.

Each call reserves the next free slot of its channel (no await between reading and writing
the slot, so concurrent senders queue up in order) and sleeps until it comes. A 429's
Retry-After pushes the channel's next slot back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

_PRUNE_ABOVE = 1024


class ChannelPacer:
    def __init__(
        self,
        interval: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.interval = max(0.0, interval)
        self._clock = clock
        self._sleep = sleep
        self._next: dict[str, float] = {}

    async def wait(self, channel: str) -> None:
        now = self._clock()
        slot = max(now, self._next.get(channel, now))
        self._next[channel] = slot + self.interval
        self._prune(now)
        if slot > now:
            await self._sleep(slot - now)

    def defer(self, channel: str, seconds: float) -> None:
        """The platform asked us to wait `seconds` before the next send to `channel`."""
        later = self._clock() + max(0.0, seconds)
        self._next[channel] = max(self._next.get(channel, later), later)

    def _prune(self, now: float) -> None:
        if len(self._next) > _PRUNE_ABOVE:
            self._next = {key: slot for key, slot in self._next.items() if slot > now}
