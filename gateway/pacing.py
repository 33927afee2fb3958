"""When a send may go: a chat's pacing and the platform's holds (retry_after), and the backoff
between retries of a transient failure. The outbox asks both before every attempt."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway import metrics
from gateway.config import OutboxConfig
from gateway.events import ThreadKey

Sleep = Callable[[float], Awaitable[None]]


class ChatPacer:
    """Per chat: at most one send per `interval_s` (0: no pacing of its own; channels pace),
    and nothing at all while the platform's `retry_after` holds the chat, however long."""

    def __init__(
        self, interval_s: float = 0.0, *, clock: Callable[[], float] = time.monotonic, sleep: Sleep = asyncio.sleep
    ):
        self.interval_s = interval_s
        self._clock, self._sleep = clock, sleep
        self._next: dict[tuple[str, str], float] = {}
        self._held: dict[tuple[str, str], float] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def wait(self, thread: ThreadKey) -> None:
        key = (thread.channel, thread.chat)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            waited = 0.0
            while (delay := max(self._next.get(key, 0.0), self._held.get(key, 0.0)) - self._clock()) > 0:
                await self._sleep(delay)  # again: a hold may have been extended meanwhile
                waited += delay
            if waited:
                metrics.RATE_LIMIT_WAITS.labels(thread.channel).inc()
                metrics.RATE_LIMIT_SECONDS.labels(thread.channel).inc(waited)
            if self.interval_s > 0:
                self._next[key] = self._clock() + self.interval_s

    def hold(self, thread: ThreadKey, seconds: float) -> None:
        """The platform asked us to wait (retry_after): nothing goes to this chat before then."""
        key = (thread.channel, thread.chat)
        self._held[key] = max(self._held.get(key, 0.0), self._clock() + seconds)

    async def sleep(self, seconds: float) -> None:
        await self._sleep(seconds)

    def held_for(self, thread: ThreadKey) -> float:
        """Seconds until the chat may be sent to again (0 when it is not held)."""
        return max(0.0, self._held.get((thread.channel, thread.chat), 0.0) - self._clock())


@dataclass(frozen=True)
class RetryPolicy:
    """Transient failures: up to `max_attempts` tries, exponential backoff with full jitter.
    A platform's retry_after is a wait, not a failure: it never uses up an attempt."""

    max_attempts: int = 5
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0

    @classmethod
    def from_config(cls, config: OutboxConfig) -> RetryPolicy:
        return cls(config.max_attempts, config.backoff_s, config.backoff_max_s)

    def backoff(self, failures: int) -> float:
        cap = min(self.backoff_max_s, self.backoff_s * 2 ** (failures - 1))
        return random.uniform(cap / 2, cap)
