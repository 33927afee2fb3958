"""Recorded, paced, idempotent delivery.

Every outbound message, prompt and prompt update is recorded under an idempotency key before it
is sent and marked with its platform message ids after; sending a key that is already marked
sent returns the recorded ids, so a resumed or restarted turn never answers twice.

Sends are fenced (gateway/delivery/fencing.py): each attempt first proves the lease its sender works
under, and each write of a send carries that lease's fence, so a stalled holder that lost the
thread to another instance neither sends nor records.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import timedelta
from typing import Any, TypeVar

from gateway import telemetry
from gateway.delivery import fencing
from gateway.delivery.pacing import ChatPacer, RetryPolicy
from gateway.events import (
    Channel,
    ChannelError,
    Delivered,
    Outbound,
    Prompt,
    ReplyStream,
    StoreUnwritable,
    ThreadKey,
    utcnow,
)
from gateway.serving import metrics
from gateway.store import FinalStage, LeaseLost, OutboxRecord, Store

log = logging.getLogger(__name__)
T = TypeVar("T")
Attempt = Callable[[tuple[str, ...]], Awaitable[T]]  # called with the parts already posted


AMBIGUOUS_RESENT = "timed out, may have been delivered: sent again once"
AMBIGUOUS_GAVE_UP = "timed out again after the one resend: not sent a third time"
STALLED = "sent by a holder that stalled and lost the thread meanwhile: may be in the chat"
ORPHANED = "its sender stopped before recording what became of its send: may be in the chat; sent again once"


class Outbox:
    def __init__(
        self,
        store: Store,
        channels: Mapping[str, Channel],
        *,
        pacer: ChatPacer | None = None,
        policy: RetryPolicy | None = None,
    ):
        self.store = store
        self.channels = channels
        self.pacer = pacer or ChatPacer()
        self.policy = policy or RetryPolicy()

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
        if message.links:
            payload["links"] = list(message.links)
        if message.file is not None:
            payload["file"] = asdict(message.file)
        return await self._deliver(
            message.key, message.thread, "message", payload, lambda ch, done: ch.send(replace(message, already=done))
        )

    async def send_text(
        self, thread: ThreadKey, text: str, *, key: str, reply_to: str = "", links: Sequence[str] = ()
    ) -> Delivered:
        return await self.send(Outbound(thread, text, key, reply_to, links=tuple(links)))

    async def send_prompt(self, prompt: Prompt) -> Delivered:
        payload = asdict(prompt)
        payload["thread"] = str(prompt.thread)
        return await self._deliver(
            prompt.key, prompt.thread, "prompt", payload, lambda ch, _done: ch.send_prompt(prompt)
        )

    async def close_prompt(self, key: str, thread: ThreadKey, message_ids: list[str], outcome: str) -> None:
        if not message_ids:
            return

        async def close(ch: Channel, _done: tuple[str, ...]) -> Delivered:
            await ch.close_prompt(thread, message_ids, outcome)
            return Delivered(tuple(message_ids))

        await self._deliver(key, thread, "close_prompt", {"outcome": outcome, "message_ids": message_ids}, close)

    def stream(
        self,
        thread: ThreadKey,
        reply_to: str = "",
        adopt: Sequence[str] = (),
        *,
        progress_key: str | None = None,
        uncertain: bool = False,
        links: Sequence[str] = (),
    ) -> RecordedStream:
        return RecordedStream(
            self, thread, reply_to, adopt, progress_key=progress_key, uncertain=uncertain, links=links
        )

    async def _deliver(
        self,
        key: str,
        thread: ThreadKey,
        kind: str,
        payload: dict[str, Any],
        action: Callable[[Channel, tuple[str, ...]], Awaitable[Delivered]],
    ) -> Delivered:
        record = await self.store.outbox.record(key, str(thread), kind, payload, fence=fencing.fence())
        if record.status == "sent":
            return Delivered(tuple(record.message_ids))
        return await self.deliver_recorded(record, thread, action)

    async def deliver_recorded(
        self,
        record: OutboxRecord,
        thread: ThreadKey,
        action: Callable[[Channel, tuple[str, ...]], Awaitable[Delivered]],
    ) -> Delivered:
        channel = self.channel(thread)
        delivered = await self.with_retries(thread, lambda done: action(channel, done), record=record)
        fence = fencing.fence()
        await recorded(lambda: self.store.outbox.mark_sent(record.id, list(delivered.message_ids), fence=fence))
        metrics.OUTBOX.labels(thread.channel).inc()
        return delivered

    async def with_retries(self, thread: ThreadKey, call: Attempt[T], *, record: OutboxRecord | None = None) -> T:
        """`_with_retries`, in a span of the run being traced (a send: one per recorded delivery)."""
        spans = telemetry.current()
        if spans is None:
            return await self._with_retries(thread, call, record=record)
        kind = record.kind if record is not None else "message"
        attributes = {"messaging.system": thread.channel, "gateway.outbox.kind": kind, "gateway.thread": str(thread)}
        if record is not None:
            attributes["gateway.outbox.key"] = record.key
        with spans.span(f"send {kind}", attributes) as span:
            result = await self._with_retries(thread, call, record=record)
            ids = getattr(result, "message_ids", ())
            if ids:
                span.set("messaging.message.id", str(ids[-1]))
                span.set("gateway.outbox.messages", len(ids))
            return result

    async def _with_retries(self, thread: ThreadKey, call: Attempt[T], *, record: OutboxRecord | None = None) -> T:
        """The one retry layer: wait out the chat's hold, try, and on failure decide
        (`_next_step`). Every failed attempt is written on the row: the error, when the next
        attempt is due, the parts already posted, and what an ambiguous failure decided."""
        state = _Attempts(resent_once=record is not None and record.uncertain is not None)
        done = tuple(record.message_ids) if record is not None else ()
        while True:
            await self.pacer.wait(thread)
            await fencing.proven()  # a holder that stalled and lost the thread sends nothing
            try:
                return await call(done)
            except ChannelError as exc:
                done = exc.delivered or done
                step = self._next_step(exc, state)
                _count_failure(thread.channel, exc, step)
                if exc.retry_after is not None and not step.final:
                    await self.pacer.hold(thread, step.wait)
                if record is not None:
                    await self._attempt_failed(record, exc, step, done)
                if step.final or state.failures >= self.policy.max_attempts:
                    log.error(
                        "delivery to %s failed (%s)%s", thread, exc, "" if step.final else "; left for the sweeper"
                    )
                    raise
                log.warning("delivery to %s: %s; next attempt in %.1fs", thread, exc, step.wait)
                if exc.retry_after is None and step.wait:
                    await self.pacer.sleep(step.wait)  # a hold is waited out by pacer.wait

    async def _attempt_failed(
        self, record: OutboxRecord, exc: ChannelError, step: _Step, done: tuple[str, ...]
    ) -> None:
        retry_at = None if step.final else utcnow() + timedelta(seconds=step.wait)
        try:
            fence = fencing.fence()
            await recorded(
                lambda: self.store.outbox.attempt_failed(
                    record.id,
                    str(exc),
                    final=step.final,
                    retry_at=retry_at,
                    uncertain=step.uncertain,
                    delivered=done,
                    fence=fence,
                )
            )
        except LeaseLost:
            # Stalled mid-request while another instance took the thread over: what it sent
            # may be in the chat beside the new holder's answer. Recorded, not decided.
            if exc.ambiguous or done != tuple(record.message_ids):
                await self.store.outbox.note_uncertain(record.key, record.thread_key, record.kind, STALLED, done)
            raise

    def _next_step(self, exc: ChannelError, state: _Attempts) -> _Step:
        """- permanent: the row fails at once;
        - `retry_after`: the chat is held that long (any length: the message waits, it is never
          dropped); no attempt is used up;
        - ambiguous (a new message timed out and may be in the chat): sent again at most once
          per row, across restarts too (the row remembers), and the decision recorded;
        - other transient failures: backoff with jitter, `max_attempts` times, then the row is
          left pending for the sweeper."""
        if exc.permanent:
            return _Step(final=True)
        if exc.retry_after is not None:
            return _Step(wait=exc.retry_after)
        if exc.ambiguous:
            if state.resent_once:
                return _Step(final=True, uncertain=AMBIGUOUS_GAVE_UP)
            state.resent_once = True
            return _Step(uncertain=AMBIGUOUS_RESENT)
        state.failures += 1
        return _Step(wait=self.policy.backoff(state.failures))


RECORD_RETRY_S = 60.0  # how long a write recording what a platform did is tried while the database is away


async def recorded(write: Callable[[], Awaitable[Any]]) -> None:
    """A write that records what the platform already did (a message posted, a send that timed
    out): tried again while the database is away (restarted, failing over), for up to
    RECORD_RETRY_S. Given up at once, a posted message went unrecorded and was sent again by
    the turn that continued; a lost lease is never retried (the new holder decides). A disk that
    refuses writes (full, read-only) is waited out however long it lasts, quietly (the store
    said it once): the message is out, and only its record can keep it from going out again."""
    delay, waited = 0.2, 0.0
    while True:
        try:
            await write()
            return
        except LeaseLost:
            raise
        except StoreUnwritable as exc:
            log.debug("could not record a delivery (%s); trying again in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
        except Exception as exc:  # noqa: BLE001 - the driver's errors of a database that is away
            if waited >= RECORD_RETRY_S:
                raise
            log.warning("could not record a delivery (%s); trying again in %.1fs", exc, delay)
            await asyncio.sleep(delay)
            waited += delay
            delay = min(delay * 2, 5.0)


def _count_failure(channel: str, exc: ChannelError, step: _Step) -> None:
    if step.uncertain is not None:
        metrics.OUTBOX_AMBIGUOUS.labels(channel, "gave_up" if step.final else "resent").inc()
    if not step.final:
        reason = "retry_after" if exc.retry_after is not None else "ambiguous" if exc.ambiguous else "backoff"
        metrics.OUTBOX_RETRIES.labels(channel, reason).inc()


@dataclass
class _Attempts:
    resent_once: bool
    failures: int = 0


@dataclass(frozen=True)
class _Step:
    final: bool = False
    wait: float = 0.0
    uncertain: str | None = None


class RecordedStream:
    """A channel reply stream whose final delivery is recorded under a key.

    With a `progress_key`, the platform messages showing the partial reply are recorded under
    it as soon as the stream opens them (and whenever they change), so that after a crash of
    any kind the turn that continues adopts and edits them instead of posting a second reply.
    The record is cleared in the same write that marks the final delivery sent."""

    def __init__(
        self,
        outbox: Outbox,
        thread: ThreadKey,
        reply_to: str,
        adopt: Sequence[str] = (),
        *,
        progress_key: str | None = None,
        uncertain: bool = False,
        links: Sequence[str] = (),
    ):
        self.outbox = outbox
        self._links = tuple(links)  # of the person's message: its previews may show
        self.thread = thread
        self._stream: ReplyStream | None = None
        self._reply_to = reply_to
        self._adopt = tuple(adopt)
        self._failed = False
        self._text_so_far: Callable[[], str] | None = None
        self._progress_key = progress_key
        self._progress_id: int | None = None
        self._recorded: tuple[str, ...] = ()
        # A message the stream posted timed out: it may be in the chat (or the one an interrupted
        # reply posted did, when this stream continues it).
        self._uncertain = uncertain

    def message_ids(self) -> tuple[str, ...]:
        """The messages showing the reply so far (to be adopted after a restart)."""
        if self._stream is None:
            return self._adopt
        return tuple(getattr(self._stream, "message_ids", lambda: ())())

    def _open(self) -> ReplyStream | None:
        if self._stream is None and not self._failed:
            try:
                channel = self.outbox.channel(self.thread)
                extra: dict[str, Any] = {"adopt": self._adopt} if self._adopt else {}
                if self._links:
                    extra["links"] = self._links
                self._stream = channel.open_stream(self.thread, self._reply_to, **extra)
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
        if stream is None or self._uncertain or (wants is not None and not wants()):
            return
        await self.update(text_so_far())

    async def thinking(self) -> None:
        """The model is reasoning and has written nothing yet: a channel that can say so in its
        stream (Telegram's rich drafts) does; the others show nothing (their busy sign is on)."""
        stream = self._open()
        think = getattr(stream, "thinking", None)
        if think is None or self._uncertain or self.outbox.pacer.held_for(self.thread) > 0:
            return
        try:
            await think()
        except ChannelError as exc:
            if exc.retry_after is not None:
                await self.outbox.pacer.hold(self.thread, exc.retry_after)
            log.info("stream thinking sign to %s failed: %s", self.thread, exc)

    async def update(self, text: str) -> None:
        stream = self._open()
        if stream is None or not text or self._uncertain or self.outbox.pacer.held_for(self.thread) > 0:
            return  # progress is optional: none while the platform holds the chat (the final text waits)
        await fencing.proven()  # an edit after a stall could overwrite the new holder's reply
        await self._note_first_post(stream)
        try:
            await stream.update(text)
        except ChannelError as exc:  # progress is best effort; the final text is what counts
            if exc.retry_after is not None:
                await self.outbox.pacer.hold(self.thread, exc.retry_after)
            # A new message that timed out may be in the chat: no more progress (each update
            # could post it again); the final delivery is its one resend, recorded as such.
            if exc.ambiguous and not self._uncertain:
                self._uncertain = True
                await self._note_uncertain(text, str(exc))
            log.info("stream update to %s failed: %s", self.thread, exc)
        await self.note_progress()

    async def _note_first_post(self, stream: ReplyStream) -> None:
        """Before a stream posts its first message (an edited reply's, not a draft): its progress
        record, so that a kill while the platform is slow to answer leaves the intent behind, and
        the turn that continues the reply takes its delivery for the one resend."""
        if self._progress_key is None or self._progress_id is not None or not getattr(stream, "posts_messages", False):
            return
        if self.message_ids():
            return
        posting = {"posting": True}
        record = await self.outbox.store.outbox.record(
            self._progress_key, str(self.thread), "partial", posting, fence=fencing.fence()
        )
        self._progress_id = record.id

    async def _note_uncertain(self, text: str, error: str) -> None:
        """Written on the progress record at once, not only when the reply is delivered: a
        stop of any kind before then (kill -9 included) leaves it listed by `gateway outbox`,
        and the turn that continues the reply knows its delivery is the one resend."""
        if self._progress_key is None:
            return
        repo, fence = self.outbox.store.outbox, fencing.fence()
        if self._progress_id is None:
            self._progress_id = (await repo.record(self._progress_key, str(self.thread), "partial", {}, fence=fence)).id
        await repo.attempt_failed(
            self._progress_id, error, final=False, uncertain=AMBIGUOUS_RESENT, payload=self.intent(text), fence=fence
        )

    async def note_progress(self) -> None:
        """Record the messages now showing the partial reply, when they changed."""
        ids = self.message_ids()
        if self._progress_key is None or not ids or ids == self._recorded:
            return
        repo, fence = self.outbox.store.outbox, fencing.fence()
        try:
            if self._progress_id is None:
                record = await repo.record(self._progress_key, str(self.thread), "partial", {}, fence=fence)
                self._progress_id = record.id
            progress_id = self._progress_id
            await recorded(lambda: repo.remember_partial(progress_id, ids, fence=fence))
        except LeaseLost:
            new = [i for i in ids if i not in self._recorded]  # posted, never recorded: the new holder cannot know
            if new:
                await repo.note_uncertain(self._progress_key, str(self.thread), "partial", STALLED, new)
            raise
        self._recorded = ids

    async def _forget_progress(self) -> None:
        if self._progress_id is not None:
            await self.outbox.store.outbox.forget_partial(self._progress_id, fence=fencing.fence())
            self._recorded = ()

    def intent(self, text: str) -> dict[str, Any]:
        """The outbox payload of delivering `text` here (see `deliver`)."""
        return {"text": text, "reply_to": self._reply_to, **({"links": list(self._links)} if self._links else {})}

    async def finish(self, key: str, text: str) -> Delivered:
        """Deliver the final text once: a key already sent returns its recorded ids."""
        record = await self.outbox.store.outbox.record(
            key, str(self.thread), "message", self.intent(text), fence=fencing.fence()
        )
        return await self.deliver(record, text)

    async def deliver(self, record: OutboxRecord, text: str, *, final_stage: FinalStage | None = None) -> Delivered:
        """Deliver the final text under an intent already recorded (with `intent(text)`); with
        `final_stage`, the run this reply ends is finished in the same write that marks it sent."""
        fence = fencing.fence()
        if record.status == "sent":  # delivered before: the run's stage is its trace's to write
            await self.abort()
            return Delivered(tuple(record.message_ids))
        if self._uncertain and record.uncertain is None:
            await self.outbox.store.outbox.attempt_failed(
                record.id, "a streamed message timed out", final=False, uncertain=AMBIGUOUS_RESENT, fence=fence
            )
            record = replace(record, uncertain=AMBIGUOUS_RESENT)
        stream = self._open()
        if stream is None:
            channel = self.outbox.channel(self.thread)
            delivered = await self.outbox.with_retries(
                self.thread,
                lambda done: channel.send(
                    Outbound(self.thread, text, record.key, self._reply_to, already=done, links=self._links)
                ),
                record=record,
            )
        else:
            delivered = await self.outbox.with_retries(self.thread, lambda _done: stream.finish(text), record=record)
        forget = self._progress_id  # its messages (and an uncertain one) are the reply's now
        if forget is None and self._uncertain and self._progress_key is not None:  # adopted, never updated
            repo = self.outbox.store.outbox
            forget = (await repo.record(self._progress_key, str(self.thread), "partial", {}, fence=fence)).id
        await recorded(
            lambda: self.outbox.store.outbox.mark_sent(
                record.id, list(delivered.message_ids), final_stage=final_stage, forget=forget, fence=fence
            )
        )
        metrics.OUTBOX.labels(self.thread.channel).inc()
        self._recorded = ()
        self._stream = None
        return replace(delivered, finished_run=final_stage is not None)

    async def abort(self) -> None:
        """Stop showing progress; the partial reply is no longer continued by anyone."""
        if self._stream is not None:
            note = getattr(self._stream, "note", None)
            if note is not None and self._text_so_far is not None:
                note(self._text_so_far())  # what was generated last, for the stream to leave shown
            try:
                await self._stream.abort()
            except ChannelError:
                pass
            self._stream = None
        await self._forget_progress()
