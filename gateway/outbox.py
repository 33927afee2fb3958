"""Recorded, rate-limited, idempotent delivery.

Every outbound message, prompt and prompt update is recorded under an idempotency key before it
is sent and marked with its platform message ids after; sending a key that is already marked
sent returns the recorded ids, so a resumed or restarted turn never answers twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, TypeVar

from gateway.events import (
    Channel,
    ChannelError,
    Delivered,
    Outbound,
    Prompt,
    ReplyStream,
    ThreadKey,
)
from gateway.store import OutboxRecord, RunEnd, Store

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_ATTEMPTS = 4


class ChatRateLimiter:
    """At most one send per `interval_s` per chat, waiting (not dropping) when faster."""

    def __init__(self, interval_s: float = 0.0):
        self.interval_s = interval_s
        self._next: dict[tuple[str, str], float] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    async def wait(self, thread: ThreadKey) -> None:
        if self.interval_s <= 0:
            return
        key = (thread.channel, thread.chat)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            delay = self._next.get(key, 0.0) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self._next[key] = time.monotonic() + self.interval_s

    def hold(self, thread: ThreadKey, seconds: float) -> None:
        """The platform asked us to wait (retry_after): nothing goes to this chat before then."""
        key = (thread.channel, thread.chat)
        self._next[key] = max(self._next.get(key, 0.0), time.monotonic() + seconds)


class Outbox:
    def __init__(
        self,
        store: Store,
        channels: Mapping[str, Channel],
        *,
        limiter: ChatRateLimiter | None = None,
        max_retry_wait_s: float = 60.0,
    ):
        self.store = store
        self.channels = channels
        self.limiter = limiter or ChatRateLimiter()
        self.max_retry_wait_s = max_retry_wait_s

    def channel(self, thread: ThreadKey) -> Channel:
        try:
            return self.channels[thread.channel]
        except KeyError:
            raise ChannelError(f"no channel {thread.channel!r} is enabled for {thread}", permanent=True) from None

    async def send(self, message: Outbound) -> Delivered:
        payload: dict[str, Any] = {
            "text": message.text,
            "reply_to": message.reply_to,
            "document": list(message.document) if message.document else None,
        }
        if message.file is not None:
            payload["file"] = asdict(message.file)
        return await self._deliver(message.key, message.thread, "message", payload, lambda ch: ch.send(message))

    async def send_text(self, thread: ThreadKey, text: str, *, key: str, reply_to: str = "") -> Delivered:
        return await self.send(Outbound(thread, text, key, reply_to))

    async def send_prompt(self, prompt: Prompt) -> Delivered:
        payload = asdict(prompt)
        payload["thread"] = str(prompt.thread)
        return await self._deliver(prompt.key, prompt.thread, "prompt", payload, lambda ch: ch.send_prompt(prompt))

    async def close_prompt(self, key: str, thread: ThreadKey, message_ids: list[str], outcome: str) -> None:
        if not message_ids:
            return

        async def close(ch: Channel) -> Delivered:
            await ch.close_prompt(thread, message_ids, outcome)
            return Delivered(tuple(message_ids))

        await self._deliver(key, thread, "close_prompt", {"outcome": outcome, "message_ids": message_ids}, close)

    def stream(self, thread: ThreadKey, reply_to: str = "", adopt: Sequence[str] = ()) -> RecordedStream:
        return RecordedStream(self, thread, reply_to, adopt)

    async def _deliver(
        self,
        key: str,
        thread: ThreadKey,
        kind: str,
        payload: dict[str, Any],
        action: Callable[[Channel], Awaitable[Delivered]],
    ) -> Delivered:
        record = await self.store.outbox.record(key, str(thread), kind, payload)
        if record.status == "sent":
            return Delivered(tuple(record.message_ids))
        channel = self.channel(thread)
        delivered = await self.with_retries(thread, lambda: action(channel), record_id=record.id)
        await self.store.outbox.mark_sent(record.id, list(delivered.message_ids))
        return delivered

    async def with_retries(
        self, thread: ThreadKey, call: Callable[[], Awaitable[T]], *, record_id: int | None = None
    ) -> T:
        """Rate-limit, then retry transient failures honouring the platform's retry_after."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            await self.limiter.wait(thread)
            try:
                return await call()
            except ChannelError as exc:
                final = exc.permanent or attempt == MAX_ATTEMPTS
                if record_id is not None:
                    await self.store.outbox.mark_failed(record_id, str(exc), final=final)
                if final:
                    log.error("delivery to %s failed: %s", thread, exc)
                    raise
                wait = exc.retry_after if exc.retry_after is not None else min(2**attempt * 0.25, 5.0)
                if wait > self.max_retry_wait_s:
                    raise
                self.limiter.hold(thread, wait)
                log.warning("delivery to %s: %s; retrying in %.1fs", thread, exc, wait)
        raise AssertionError("unreachable")


class RecordedStream:
    """A channel reply stream whose final delivery is recorded under a key."""

    def __init__(self, outbox: Outbox, thread: ThreadKey, reply_to: str, adopt: Sequence[str] = ()):
        self.outbox = outbox
        self.thread = thread
        self._stream: ReplyStream | None = None
        self._reply_to = reply_to
        self._adopt = tuple(adopt)
        self._failed = False
        self._text_so_far: Callable[[], str] | None = None

    def message_ids(self) -> tuple[str, ...]:
        """The messages showing the reply so far (to be adopted after a restart)."""
        if self._stream is None:
            return self._adopt
        return tuple(getattr(self._stream, "message_ids", lambda: ())())

    def _open(self) -> ReplyStream | None:
        if self._stream is None and not self._failed:
            try:
                channel = self.outbox.channel(self.thread)
                if self._adopt:
                    self._stream = channel.open_stream(self.thread, self._reply_to, adopt=self._adopt)
                else:
                    self._stream = channel.open_stream(self.thread, self._reply_to)
            except ChannelError as exc:
                self._failed = True
                log.warning("cannot stream to %s: %s", self.thread, exc)
        return self._stream

    async def show(self, text_so_far: Callable[[], str]) -> None:
        """Offer the reply so far: the text is built (and the channel renders it) only when
        the channel would show an update now, so a long stream costs its length, not its
        length times its chunks."""
        self._text_so_far = text_so_far
        stream = self._open()
        wants = getattr(stream, "wants_update", None)
        if stream is None or (wants is not None and not wants()):
            return
        await self.update(text_so_far())

    async def update(self, text: str) -> None:
        stream = self._open()
        if stream is None or not text:
            return
        try:
            await stream.update(text)
        except ChannelError as exc:  # progress is best effort; the final text is what counts
            log.info("stream update to %s failed: %s", self.thread, exc)

    def intent(self, text: str) -> dict[str, Any]:
        """The outbox payload of delivering `text` here (see `deliver`)."""
        return {"text": text, "reply_to": self._reply_to}

    async def finish(self, key: str, text: str) -> Delivered:
        """Deliver the final text once: a key already sent returns its recorded ids."""
        record = await self.outbox.store.outbox.record(key, str(self.thread), "message", self.intent(text))
        return await self.deliver(record, text)

    async def deliver(self, record: OutboxRecord, text: str, *, run_end: RunEnd | None = None) -> Delivered:
        """Deliver the final text under an intent already recorded (with `intent(text)`); with
        `run_end`, the run this reply ends is finished in the same write that marks it sent."""
        if record.status == "sent":
            await self.abort()
            if run_end is not None:
                await self.outbox.store.runs.set_stage(run_end.run_id, run_end.stage, end_reason=run_end.end_reason)
            return Delivered(tuple(record.message_ids))
        stream = self._open()
        if stream is None:
            delivered = await self.outbox.with_retries(
                self.thread,
                lambda: self.outbox.channel(self.thread).send(Outbound(self.thread, text, record.key, self._reply_to)),
                record_id=record.id,
            )
        else:
            delivered = await self.outbox.with_retries(self.thread, lambda: stream.finish(text), record_id=record.id)
        await self.outbox.store.outbox.mark_sent(record.id, list(delivered.message_ids), run_end=run_end)
        self._stream = None
        return delivered

    async def abort(self) -> None:
        if self._stream is not None:
            note = getattr(self._stream, "note", None)
            if note is not None and self._text_so_far is not None:
                note(self._text_so_far())  # what was generated last, for the stream to leave shown
            try:
                await self._stream.abort()
            except ChannelError:
                pass
            self._stream = None
