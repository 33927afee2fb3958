"""How late the event loop runs: the lag of a timer that should fire every `interval`.

A loop that is busy (one long callback, or more work than one core does) runs everything
late: replies, lease renewals, webhook answers. The lag is sampled all the time (a timer
costs microseconds) and reported by /metrics over a sliding window.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class LoopLag:
    def __init__(self, interval_s: float = 0.05, window_s: float = 30.0) -> None:
        self.interval_s = interval_s
        self._samples: deque[float] = deque(maxlen=max(1, int(window_s / interval_s)))
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sample_forever(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _sample_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self._samples.append(max(0.0, loop.time() - due))

    def quantile(self, q: float) -> float:
        """The q-quantile of the lag in the window, in seconds (0 before any sample)."""
        if not self._samples:
            return 0.0
        ordered = sorted(self._samples)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def worst(self) -> float:
        return max(self._samples, default=0.0)
