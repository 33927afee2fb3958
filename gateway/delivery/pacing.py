"""When a send may go: a chat's pacing and the platform's holds (retry_after), and the backoff
between retries of a transient failure. The outbox asks both before every attempt.

A hold is the platform's word for the bot, not for one process: it is written to the database
(`SharedHolds`), and every instance follows the holds there (read at start; on PostgreSQL at
once when another instance notifies a new one, and every `HOLDS_REFRESH_S` in case a
notification was lost), so other instances, the sweeper and a restarted process leave the chat
alone too.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from gateway.config import OutboxConfig
from gateway.events import ThreadKey, utcnow
from gateway.serving import metrics

log = logging.getLogger(__name__)
Sleep = Callable[[float], Awaitable[None]]
HOLDS_REFRESH_S = 5.0  # how stale another instance's view of a new hold can be if a NOTIFY is lost
# A view older than this (its refreshes failed: the database was away; or the process was
# stopped) is read again before a send: a NOTIFY sent meanwhile may never have arrived.
HOLDS_STALE_S = 2 * HOLDS_REFRESH_S


class SharedHolds(Protocol):
    """Where holds are shared (the store's `holds`): chats keyed "<channel>:<chat id>"."""

    async def hold(self, chat: str, until: datetime) -> None: ...

    async def active(self) -> dict[str, datetime]: ...


class ChatPacer:
    """Per chat: at most one send per `interval_s` (0: no pacing of its own; channels pace),
    and nothing at all while the platform's `retry_after` holds the chat, however long."""

    def __init__(
        self,
        interval_s: float = 0.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Sleep = asyncio.sleep,
        shared: SharedHolds | None = None,
    ):
        self.interval_s = interval_s
        self._clock, self._sleep = clock, sleep
        self._next: dict[tuple[str, str], float] = {}
        self._held: dict[tuple[str, str], float] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.shared = shared
        self.changed = asyncio.Event()  # set when another instance announced a hold
        self._fresh_until = float("-inf")  # the shared holds' view is current until then

    async def wait(self, thread: ThreadKey) -> None:
        key = (thread.channel, thread.chat)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            await self._current_view()
            waited = 0.0
            while (delay := max(self._next.get(key, 0.0), self._held.get(key, 0.0)) - self._clock()) > 0:
                await self._sleep(delay)  # again: a hold may have been extended meanwhile
                waited += delay
            if waited:
                metrics.RATE_LIMIT_WAITS.labels(thread.channel).inc()
                metrics.RATE_LIMIT_SECONDS.labels(thread.channel).inc(waited)
            if self.interval_s > 0:
                self._next[key] = self._clock() + self.interval_s

    async def hold(self, thread: ThreadKey, seconds: float) -> None:
        """The platform asked us to wait (retry_after): nothing goes to this chat before then,
        from this process or any other sharing the database."""
        self._extend((thread.channel, thread.chat), self._clock() + seconds)
        if self.shared is None:
            return
        try:
            await self.shared.hold(f"{thread.channel}:{thread.chat}", utcnow() + timedelta(seconds=seconds))
        except Exception:  # noqa: BLE001 - this process honours it anyway; the others may not know
            log.warning("could not share the hold on %s", thread, exc_info=True)

    def _extend(self, key: tuple[str, str], until: float) -> None:
        self._held[key] = max(self._held.get(key, 0.0), until)

    async def _current_view(self) -> None:
        """Before a send: the shared holds read again when the view went stale (never, while
        `follow` keeps it current)."""
        if self.shared is None or self._clock() < self._fresh_until:
            return
        try:
            await self.refresh()
        except Exception:  # noqa: BLE001 - the database is away: what this process knows decides
            log.debug("reading the shared holds before a send failed", exc_info=True)

    async def refresh(self) -> None:
        """Take in the holds written by every instance (one read)."""
        if self.shared is None:
            return
        now_mono, now = self._clock(), utcnow()
        for chat, until in (await self.shared.active()).items():
            channel, _, chat_id = chat.partition(":")
            self._extend((channel, chat_id), now_mono + (until - now).total_seconds())
        for key in [k for k, until in self._held.items() if until <= now_mono]:
            del self._held[key]
        self._fresh_until = now_mono + HOLDS_STALE_S

    async def follow(self, stopped: asyncio.Event) -> None:
        """Until `stopped` (at once): refresh every HOLDS_REFRESH_S, or when `changed` is set."""
        while not stopped.is_set():
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - the database blinked: the next round reads again
                log.debug("reading the shared holds failed", exc_info=True)
            waits = [asyncio.ensure_future(self.changed.wait()), asyncio.ensure_future(stopped.wait())]
            try:
                await asyncio.wait(waits, timeout=HOLDS_REFRESH_S, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiting in waits:
                    waiting.cancel()
            self.changed.clear()

    async def sleep(self, seconds: float) -> None:
        await self._sleep(seconds)

    async def held_now(self, thread: ThreadKey) -> float:
        """`held_for`, from a current view of the shared holds (read again when it went stale:
        a worker starting right after the process did must not miss a hold it has not read yet)."""
        await self._current_view()
        return self.held_for(thread)

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
