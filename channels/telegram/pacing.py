"""Pacing Telegram sends within its flood limits: the bot's overall budget and each chat's.

A send waits for its chat's token and then (with a connection in hand, see `BotCaller`) for
the overall budget; drafts and progress edits only take what is free now and are skipped
otherwise, so they never delay a message.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

Sleep = Callable[[float], Awaitable[object]]
SWEEP_FROM = 1024  # chats' buckets kept before rested ones are swept


class TokenBucket:
    """`rate` tokens per second, bursts up to `burst`; `rate <= 0` disables it."""

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic, sleep: Sleep = asyncio.sleep
    ) -> None:
        self.rate, self.burst, self._clock, self._sleep = rate, burst, clock, sleep
        self._tokens, self._stamp = burst, clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def ready(self) -> bool:
        """A token is there now and no send is waiting for one (sends go before optional calls)."""
        if self.rate <= 0:
            return True
        if self._lock.locked():
            return False
        self._refill()
        return self._tokens >= 1

    def rested(self) -> bool:
        """Full and nobody waiting: indistinguishable from a new bucket."""
        if self._lock.locked():
            return False
        self._refill()
        return self._tokens >= self.burst

    def try_take(self) -> bool:
        """Take a token only if one is there now (for optional calls like stream edits)."""
        if not self.ready():
            return False
        if self.rate > 0:
            self._tokens -= 1
        return True

    async def take(self) -> None:
        if self.rate <= 0:
            return
        async with self._lock:
            self._refill()
            if self._tokens < 1:
                await self._sleep((1 - self._tokens) / self.rate)
                self._stamp = self._clock()
                self._tokens = 1
            self._tokens -= 1


class Slot:
    """A send's place in the overall budget, held while the request is out: on leaving the
    `with`, it counts from then (when the send has surely reached the server), not from when
    it was taken."""

    def __init__(self, window: RollingWindow | None) -> None:
        self._window = window

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._window is not None:
            self._window._done()
            self._window = None


FREE = Slot(None)  # pacing off, or an unpaced call: holds nothing


class RollingWindow:
    """At most `limit` sends in any `window_s` seconds where the server counts them (`rate` a
    second; `rate <= 0` disables it). Telegram counts a bot's messages per second as they
    arrive: a quiet bot may send a second's worth at once, but a token bucket with that burst
    lets twice the rate through in the second after it, and a busy event loop can hold sends
    taken a second apart until they leave together. So a send counts while it is out and for
    `window_s` after it is answered: however late it left, it arrived within that span."""

    def __init__(self, rate: float, clock: Callable[[], float] = time.monotonic, sleep: Sleep = asyncio.sleep) -> None:
        self._clock, self._sleep = clock, sleep
        self.set_rate(rate)
        self._answered: deque[float] = deque()  # when each send in the window was answered, oldest first
        self._out = 0  # sends taken and not yet answered
        self._answer = asyncio.Event()  # an answer came: the oldest can expire from now on
        self._lock = asyncio.Lock()

    def set_rate(self, rate: float) -> None:
        """`limit` sends in a window of `limit / rate` seconds (a rate under one a second: one
        send per 1 / rate); sends already counted stay counted."""
        self.rate = rate
        self.limit = max(1, int(rate))
        self.window_s = self.limit / rate if rate > 0 else 0.0

    def _counted(self) -> int:
        horizon = self._clock() - self.window_s
        while self._answered and self._answered[0] <= horizon:
            self._answered.popleft()
        return self._out + len(self._answered)

    def ready(self) -> bool:
        """A send may go now and none is waiting (sends go before optional calls)."""
        return self.rate <= 0 or (not self._lock.locked() and self._counted() < self.limit)

    def try_take(self) -> Slot | None:
        """A slot only if one is free now (for optional calls like drafts and stream edits)."""
        if not self.ready():
            return None
        return self._take_now()

    async def take(self) -> Slot:
        if self.rate <= 0:
            return FREE
        async with self._lock:
            while self._counted() >= self.limit:
                if self._answered:  # the oldest answered send leaves the window
                    await self._sleep(self._answered[0] + self.window_s - self._clock())
                else:  # all are out: one must be answered first
                    self._answer.clear()
                    await self._answer.wait()
            return self._take_now()

    def _take_now(self) -> Slot:
        if self.rate <= 0:
            return FREE
        self._out += 1
        return Slot(self)

    def _done(self) -> None:
        self._out -= 1
        self._answered.append(self._clock())
        self._answer.set()


class Pacer:
    """Telegram's flood limits: ~30 messages/s overall (in any one second), ~1/s per private
    chat with short bursts, ~20/min per group."""

    def __init__(
        self, overall_per_s: float, private_per_s: float, group_per_min: float,
        clock: Callable[[], float] = time.monotonic, sleep: Sleep = asyncio.sleep,
    ) -> None:
        self._clock, self._sleep = clock, sleep
        self._overall_per_s = overall_per_s
        self._overall = RollingWindow(overall_per_s, clock, sleep)
        self._private_per_s = private_per_s
        self._group_per_s = group_per_min / 60
        self._chats: dict[int, TokenBucket] = {}
        self._sweep_at = SWEEP_FROM
        # chat -> (when a 429 came, until when its retry_after holds the chat)
        self._held: dict[int, tuple[float, float]] = {}

    def share_among(self, instances: int) -> None:
        """`instances` processes send for this bot: Telegram counts the bot's messages, so each
        takes an equal share of the overall budget. (A chat's own limit needs no sharing: one
        instance at a time answers a chat, holding its thread's lease.)"""
        self._overall.set_rate(self._overall_per_s / max(1, instances))

    def _bucket(self, chat_id: int) -> TokenBucket:
        bucket = self._chats.get(chat_id)
        if bucket is None:
            if len(self._chats) >= self._sweep_at:
                self._forget_rested()
            rate = self._group_per_s if chat_id < 0 else self._private_per_s
            burst = max(3.0, rate * 60) if chat_id < 0 else 3.0
            bucket = self._chats[chat_id] = TokenBucket(rate, burst, self._clock, self._sleep)
        return bucket

    def _forget_rested(self) -> None:
        """Drop the buckets that are full again and unused (a new one starts full, the same):
        one per chat ever served would grow without bound. Swept when the map has doubled."""
        self._chats = {chat: bucket for chat, bucket in self._chats.items() if not bucket.rested()}
        self._sweep_at = max(SWEEP_FROM, 2 * len(self._chats))

    def now(self) -> float:
        return self._clock()

    def hold(self, chat_id: int, seconds: float) -> None:
        """Telegram answered 429 for this chat: the sends already queued behind that one are held
        too. (A send asked for after it comes from the outbox, which waits out the hold itself.)"""
        now = self._clock()
        _, until = self._held.get(chat_id, (now, 0.0))
        self._held[chat_id] = (now, max(until, now + seconds))

    def held_for(self, chat_id: int, *, queued_at: float = float("-inf")) -> float:
        """Seconds the chat's flood wait still holds a send queued at `queued_at` (0: none, or
        the 429 came before that send was asked for)."""
        held = self._held.get(chat_id)
        if held is None:
            return 0.0
        received, until = held
        left = until - self._clock()
        if left <= 0:
            del self._held[chat_id]
            return 0.0
        return left if received >= queued_at else 0.0

    async def wait_chat(self, chat_id: int) -> None:
        await self._bucket(chat_id).take()

    async def wait_overall(self) -> Slot:
        """The send's slot in the bot's overall budget, to hold while its request is out."""
        return await self._overall.take()

    def try_take(self, chat_id: int) -> Slot | None:
        """A token from the chat's bucket and a slot of the bot's overall budget if both are
        free now; never waits (progress edits)."""
        chat = self._bucket(chat_id)
        if not (chat.ready() and self._overall.ready()) or self.held_for(chat_id):
            return None
        chat.try_take()
        return self._overall.try_take()

    def spare(self) -> Slot | None:
        """A slot of the bot's overall budget if one is free now; never waits. Drafts take
        these: a thousand chats streaming at once stay within the bot's limit, and a draft
        never delays a message (it is skipped; a later one shows the newer text)."""
        return self._overall.try_take()

    def has_spare(self) -> bool:
        return self._overall.ready()
