"""Calling the Bot API: pacing, retries and the translation of PTB errors.

Every send and edit goes through `BotCaller.call`, which paces per chat and overall,
honours `RetryAfter`, retries network errors and 5xx with backoff, and turns what is
left into a `ChannelError` logged with the chat id.
"""

from __future__ import annotations

import asyncio
import logging
import time
import warnings
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from telegram import MessageEntity
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Forbidden,
    InvalidToken,
    NetworkError,
    RetryAfter,
    TelegramError,
    TimedOut,
)

from channels.telegram.render import Rendered, utf16_entities
from gateway.events import ChannelError

log = logging.getLogger("channels.telegram")
T = TypeVar("T")


def retry_after_seconds(exc: RetryAfter) -> float:
    with warnings.catch_warnings():  # PTB warns that the int form will become a timedelta
        warnings.simplefilter("ignore", DeprecationWarning)
        value = exc.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def is_not_modified(exc: BaseException) -> bool:
    return isinstance(exc, BadRequest) and "not modified" in exc.message.lower()


def is_parse_error(exc: BaseException) -> bool:
    return isinstance(exc, BadRequest) and "can't parse entities" in exc.message.lower()


def ptb_entities(rendered: Rendered) -> list[MessageEntity]:
    return [
        MessageEntity(e.type, e.offset, e.length, url=e.url or None, language=e.language or None)
        for e in utf16_entities(rendered)
    ]


class TokenBucket:
    """`rate` tokens per second, bursts up to `burst`; `rate <= 0` disables it."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self._clock = rate, burst, clock
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
                await asyncio.sleep((1 - self._tokens) / self.rate)
                self._stamp = self._clock()
                self._tokens = 1
            self._tokens -= 1


class Pacer:
    """Telegram's flood limits: ~30 messages/s overall, ~1/s per private chat, ~20/min per group."""

    def __init__(self, overall_per_s: float, private_per_s: float, group_per_min: float) -> None:
        self._overall = TokenBucket(overall_per_s, max(overall_per_s, 1))
        self._private_per_s = private_per_s
        self._group_per_s = group_per_min / 60
        self._chats: dict[int, TokenBucket] = {}

    def _bucket(self, chat_id: int) -> TokenBucket:
        bucket = self._chats.get(chat_id)
        if bucket is None:
            rate = self._group_per_s if chat_id < 0 else self._private_per_s
            burst = max(3.0, rate * 60) if chat_id < 0 else 3.0
            bucket = self._chats[chat_id] = TokenBucket(rate, burst)
        return bucket

    async def wait(self, chat_id: int) -> None:
        await self._bucket(chat_id).take()
        await self._overall.take()

    def try_take(self, chat_id: int) -> bool:
        """A token from the chat's bucket and from the bot's overall one if both are free now;
        never waits (progress edits)."""
        chat = self._bucket(chat_id)
        return chat.ready() and self._overall.ready() and chat.try_take() and self._overall.try_take()

    def spare(self) -> bool:
        """A token of the bot's overall budget if one is free now; never waits. Drafts take
        these: a thousand chats streaming at once stay within the bot's limit, and a draft
        never delays a message (it is skipped; a later one shows the newer text)."""
        return self._overall.try_take()

    def has_spare(self) -> bool:
        return self._overall.ready()


class BotCaller:
    """Runs one Bot API call with pacing, RetryAfter waits and network retries."""

    def __init__(
        self,
        pacer: Pacer,
        *,
        max_retries: int = 3,
        max_wait_s: float = 30.0,
        backoff_s: float = 0.5,
    ) -> None:
        self._pacer = pacer
        self._max_retries = max_retries
        self._max_wait_s = max_wait_s
        self._backoff_s = backoff_s

    async def call(
        self, what: str, chat_id: int, request: Callable[[], Awaitable[T]], *, paced: bool = True
    ) -> T:
        """`request` is re-invoked for each attempt. Raises ChannelError or BadRequest."""
        attempt = 0
        while True:
            if paced:
                await self._pacer.wait(chat_id)
            try:
                return await request()
            except BadRequest:
                raise  # callers decide (parse errors, "not modified"); see `permanent`
            except TelegramError as exc:
                delay = self._retry_delay(what, chat_id, exc, attempt)
            await asyncio.sleep(delay)
            attempt += 1

    def _retry_delay(self, what: str, chat_id: int, exc: TelegramError, attempt: int) -> float:
        """How long to wait before the next attempt; raises ChannelError when there is none."""
        if isinstance(exc, RetryAfter):
            wait = retry_after_seconds(exc)
            if attempt >= self._max_retries or wait > self._max_wait_s:
                raise self._failed(what, chat_id, exc, retry_after=wait) from exc
            log.info("telegram %s to chat %s: flood limit, retrying in %.1fs", what, chat_id, wait)
            return wait
        if isinstance(exc, TimedOut):
            # The message may have been delivered: let the outbox decide, don't resend blindly.
            raise self._failed(what, chat_id, exc) from exc
        if isinstance(exc, NetworkError):
            if attempt >= self._max_retries:
                raise self._failed(what, chat_id, exc) from exc
            delay = self._backoff_s * 2**attempt
            log.warning("telegram %s to chat %s failed (%s), retrying in %.1fs", what, chat_id, exc, delay)
            return delay
        permanent = isinstance(exc, (Forbidden, InvalidToken, ChatMigrated))
        raise self._failed(what, chat_id, exc, permanent=permanent) from exc

    @staticmethod
    def _failed(
        what: str, chat_id: int, exc: TelegramError, *, retry_after: float | None = None, permanent: bool = False
    ) -> ChannelError:
        log.error("telegram %s to chat %s failed: %s", what, chat_id, exc)
        return ChannelError(f"telegram {what} to chat {chat_id}: {exc}", retry_after=retry_after, permanent=permanent)


def permanent(what: str, chat_id: int, exc: BadRequest) -> ChannelError:
    log.error("telegram %s to chat %s rejected: %s", what, chat_id, exc.message)
    return ChannelError(f"telegram {what} to chat {chat_id}: {exc.message}", permanent=True)
