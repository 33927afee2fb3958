"""Calling the Bot API: pacing, retries and the translation of PTB errors.

Every send and edit goes through `BotCaller.call`, which paces per chat and overall and
turns failures into a `ChannelError` (with `retry_after`, `ambiguous`, `permanent`) logged
with the chat id. Retrying is the outbox's job. This is the only module that knows
`telegram.error`: the rest of the channel sees `ChannelError` and the subclasses below.
"""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

import httpx
from telegram import MessageEntity
from telegram.error import (
    BadRequest,
    ChatMigrated,
    Conflict,
    Forbidden,
    InvalidToken,
    RetryAfter,
    TelegramError,
    TimedOut,
)

from channels.telegram.pacing import FREE, Pacer
from channels.telegram.render import Rendered, utf16_entities
from gateway.events import ChannelError

log = logging.getLogger("channels.telegram")
T = TypeVar("T")


class Rejected(ChannelError):
    """Telegram answered 400 Bad Request: retrying the same call cannot help. `reason` is
    Telegram's description; callers decide on parse errors and "not modified"."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message, permanent=True)
        self.reason = reason

    @property
    def not_modified(self) -> bool:
        return "not modified" in self.reason.lower()

    @property
    def parse_error(self) -> bool:
        return "can't parse entities" in self.reason.lower()


class TokenRejected(ChannelError):
    """The bot token is not (or no longer) valid."""

    def __init__(self, message: str) -> None:
        super().__init__(message, permanent=True)


class Conflicted(ChannelError):
    """409 Conflict on getUpdates: another process polls this token, or a webhook is set."""


def retry_after_seconds(exc: RetryAfter) -> float:
    with warnings.catch_warnings():  # PTB warns that the int form will become a timedelta
        warnings.simplefilter("ignore", DeprecationWarning)
        value = exc.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def translate(what: str, exc: TelegramError, *, posting: bool = False) -> ChannelError:
    """The channel's error for a failed Bot API call (`what` names it in the message).
    `posting`: the call posts a new message, so a timeout leaves it maybe delivered."""
    message = f"telegram {what}: {exc}"
    if isinstance(exc, RetryAfter):
        return ChannelError(message, retry_after=retry_after_seconds(exc))
    if isinstance(exc, BadRequest):
        return Rejected(f"telegram {what}: {exc.message}", reason=exc.message)
    if isinstance(exc, TimedOut):
        # Unless it never left (no connection), the request may have reached Telegram: a
        # new message may be in the chat already.
        never_sent = isinstance(exc.__cause__, (httpx.ConnectTimeout, httpx.PoolTimeout))
        return ChannelError(message, ambiguous=posting and not never_sent)
    if isinstance(exc, InvalidToken):
        return TokenRejected(message)
    if isinstance(exc, (Forbidden, ChatMigrated)):
        return ChannelError(message, permanent=True)
    if isinstance(exc, Conflict):
        return Conflicted(message)
    return ChannelError(message)  # NetworkError (refused, reset, 5xx) and the rest


async def translated(what: str, request: Callable[[], Awaitable[T]]) -> T:
    """Runs a Bot API call outside `BotCaller` (no pacing, no log) with its errors translated."""
    try:
        return await request()
    except TelegramError as exc:
        raise translate(what, exc) from exc


def ptb_entities(rendered: Rendered) -> list[MessageEntity]:
    return [
        MessageEntity(e.type, e.offset, e.length, url=e.url or None, language=e.language or None)
        for e in utf16_entities(rendered)
    ]


# Calls that post a new message: after a timeout they may have been delivered all the same.
POSTING = frozenset({"sendMessage", "sendDocument", "sendPhoto", "sendVoice", "sendRichMessage"})
# Connections to the Bot API for calls (getUpdates has its own). Calls beyond these wait on
# `BotCaller`'s semaphore, not in httpcore's pool: its queue is scanned on every hand-over, which
# costs O(waiting) per call and, with a thousand streams, most of a core.
CONNECTIONS = 16


class BotCaller:
    """Runs one Bot API call with pacing and turns its failure into a `ChannelError`.

    It does not retry: the outbox is the one retry layer (it honours `retry_after`, backs off
    with jitter, and decides what an ambiguous failure of a new message means), so a flood
    wait is handed back at once instead of being slept through here and retried again there."""

    def __init__(self, pacer: Pacer, connections: int = CONNECTIONS) -> None:
        self._pacer = pacer
        self._slots = asyncio.Semaphore(connections)

    async def call(self, what: str, chat_id: int, request: Callable[[], Awaitable[T]], *, paced: bool = True) -> T:
        """Raises ChannelError: `Rejected` for a 400 (not logged here: callers decide on parse
        errors and "not modified"), else logged with the chat id."""
        queued_at = self._pacer.now()
        if paced:
            await self._pacer.wait_chat(chat_id)
        try:
            async with self._slots:
                # With a connection in hand the send follows at once, not after a queue that bunches them.
                with await self._pacer.wait_overall() if paced else FREE:
                    self._refuse_if_held(what, chat_id, queued_at)
                    return await request()
        except TelegramError as exc:
            error = translate(f"{what} to chat {chat_id}", exc, posting=what in POSTING)
            if error.retry_after:
                self._pacer.hold(chat_id, error.retry_after)
            if not isinstance(error, Rejected):
                log.warning("telegram %s to chat %s failed: %s", what, chat_id, exc)
            raise error from exc

    def _refuse_if_held(self, what: str, chat_id: int, queued_at: float) -> None:
        """A send that waited its turn while a 429 for its chat came back does not go: Telegram
        would refuse it too and hold the chat longer. It is handed back with the time left."""
        left = self._pacer.held_for(chat_id, queued_at=queued_at)
        if left > 0:
            message = f"telegram {what} to chat {chat_id}: held by a flood wait for {left:.0f}s more"
            raise ChannelError(message, retry_after=left)


def log_rejection(what: str, chat_id: int, exc: Rejected) -> None:
    """A rejection the caller could not work around is logged as the error it is."""
    log.error("telegram %s to chat %s rejected: %s", what, chat_id, exc.reason)
