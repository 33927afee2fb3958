"""Replies shown while they are generated.

Private chats: `sendMessageDraft` (an ephemeral animated preview) while the reply grows,
then the final `sendMessage`(s). Groups and topics: the first chunk is sent, then edited
at most once per interval per chat, then a final edit (plus extra messages when the final
text needs several). Showing progress is cosmetic: its failures are logged, not raised.
"""

from __future__ import annotations

import logging
import random
import time
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from channels.telegram.api import Rejected, ptb_entities
from channels.telegram.outlet import Outlet, Target, chunks_of
from channels.telegram.pacing import Pacer
from channels.telegram.render import Rendered
from gateway.events import ChannelError, Delivered

log = logging.getLogger("channels.telegram")
THINKING = "Thinking…"


class UpdateInterval:
    """When each chat was last updated by a stream (shared by the streams of a chat)."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[int, float] = {}

    def due(self, chat_id: int, opened: float) -> bool:
        """An update of the chat may go now: an interval after the last one, and an interval
        after the stream `opened` (a reply finished sooner needs no progress shown: its final
        send is the one call)."""
        now = self.clock()
        if now - opened < self.interval_s:
            return False
        last = self._last.get(chat_id)
        return last is None or now - last >= self.interval_s

    def mark(self, chat_id: int) -> None:
        self._last[chat_id] = self.clock()


class DraftBook:
    """The drafts this channel streamed, for what a Stop pressed on one means (Bot API 10.3): a
    stop of a reply already sent is stale; a stop of one still generating stops its turn, and
    (`stop_button: keep`) its text so far is posted when the turn lets go of the stream. Drafts
    of other instances or from before a restart are unknown here: their stop stops the turn."""

    REMEMBERED = 1024

    def __init__(self) -> None:
        self._sent: OrderedDict[int, None] = OrderedDict()
        self._stopped: set[int] = set()

    def sent(self, draft_id: int) -> None:
        self._sent[draft_id] = None
        while len(self._sent) > self.REMEMBERED:
            self._sent.popitem(last=False)
        self._stopped.discard(draft_id)

    def already_sent(self, draft_id: int) -> bool:
        return draft_id in self._sent

    def stop(self, draft_id: int) -> None:
        if len(self._stopped) < self.REMEMBERED:
            self._stopped.add(draft_id)

    def take_stop(self, draft_id: int) -> bool:
        """Whether Stop was pressed on this draft (asked once, when its stream is let go of)."""
        if draft_id in self._stopped:
            self._stopped.discard(draft_id)
            return True
        return False


class FinalOnlyStream:
    """`streaming: off`: nothing until the end."""

    def __init__(self, outlet: Outlet, target: Target, reply_to: int | None) -> None:
        self._outlet, self._target, self._reply_to = outlet, target, reply_to

    def wants_update(self) -> bool:
        return False

    async def update(self, text: str) -> None:
        return None

    async def finish(self, text: str) -> Delivered:
        ids = await self._outlet.send_reply(self._target, text, chunks_of(text), reply_to=self._reply_to)
        return Delivered(tuple(str(i) for i in ids))

    async def abort(self) -> None:
        return None

    def message_ids(self) -> tuple[str, ...]:
        return ()


class DraftStream(FinalOnlyStream):
    """Private chats: drafts while generating, real messages at the end."""

    def __init__(
        self, outlet: Outlet, target: Target, reply_to: int | None, interval: UpdateInterval, pacer: Pacer,
        *, book: DraftBook | None = None, stop_button: str = "off",
    ) -> None:
        super().__init__(outlet, target, reply_to)
        self._interval, self._pacer = interval, pacer
        self._opened = interval.clock()
        self._draft_id = random.randint(1, 2**31 - 1)
        self._enabled = True
        self._book = book or DraftBook()
        # Bot API 10.3: the draft shows Stop; with keep_on_stop Telegram leaves it on screen a while
        self._stop_kwargs = (
            {"can_stop": True, "keep_on_stop": stop_button == "keep"} if stop_button != "off" else None
        )
        self._keep = stop_button == "keep"
        self._latest = ""
        self._drafted = False
        self._thought = False  # the "Thinking…" block was asked for (rich messages on in the chat)

    @property
    def draft_id(self) -> int:
        return self._draft_id

    def note(self, text: str) -> None:
        self._latest = text

    async def finish(self, text: str) -> Delivered:
        delivered = await super().finish(text)
        self._book.sent(self._draft_id)
        return delivered

    async def abort(self) -> None:
        """Stop pressed on this draft, with `stop_button: keep`: what was generated so far is
        posted as a message (Telegram keeps a stopped draft only a short while)."""
        if not (self._book.take_stop(self._draft_id) and self._keep and self._drafted and self._latest.strip()):
            return
        try:
            await self._outlet.send_chunks(self._target, chunks_of(self._latest), reply_to=self._reply_to)
        except ChannelError as exc:
            log.warning("telegram chat %s: could not keep the stopped reply: %s", self._target.chat_id, exc)

    async def thinking(self) -> None:
        """The model reasons before it writes: with rich messages on, the draft shows Telegram's
        "Thinking…" block (sendRichMessageDraft, Bot API 10.2; the block exists only in drafts)
        until the text replaces it. A server that refuses it costs this one call."""
        if not self._enabled or self._thought or self._drafted:
            return
        self._thought = True
        chat = self._target.chat_id
        if not await self._outlet.wants_rich(chat):
            return
        params: dict[str, Any] = {
            "chat_id": chat, "draft_id": self._draft_id,
            "rich_message": {"blocks": [{"type": "thinking", "text": THINKING}]},
        }
        if self._target.thread_id is not None:
            params["message_thread_id"] = self._target.thread_id

        async def request() -> Any:
            with warnings.catch_warnings():  # newer than the library: called by name
                warnings.simplefilter("ignore")
                return await self._outlet.bot.do_api_request("sendRichMessageDraft", api_kwargs=params)

        try:
            await self._outlet.caller.call("sendRichMessageDraft", chat, request, paced=False)
        except ChannelError as exc:
            log.info("telegram chat %s: no thinking block (%s)", chat, exc)
            if exc.retry_after is not None:
                raise  # a flood wait holds the whole chat

    def wants_update(self) -> bool:
        return self._enabled and self._interval.due(self._target.chat_id, self._opened) and self._pacer.has_spare()

    async def update(self, text: str) -> None:
        if not self.wants_update():
            return  # rendered only when a draft is due
        chunks = chunks_of(text)
        slot = self._pacer.spare()  # free still: nothing ran since wants_update looked
        if not chunks or slot is None:
            return
        self._interval.mark(self._target.chat_id)
        self._latest = text
        with slot:
            try:
                await self._draft(chunks[-1], formatted=True)
                self._drafted = True
            except Rejected as exc:
                if exc.parse_error:
                    await self._quietly(chunks[-1])
                else:
                    self._disable(exc)
            except ChannelError as exc:
                self._disable(exc)
                if exc.retry_after is not None:
                    raise  # a flood wait holds the whole chat: the outbox holds the final send too

    async def _draft(self, chunk: Rendered, *, formatted: bool) -> None:
        chat = self._target.chat_id
        await self._outlet.caller.call(
            "sendMessageDraft", chat,
            lambda: self._outlet.bot.send_message_draft(
                chat, self._draft_id, chunk.text, message_thread_id=self._target.thread_id,
                entities=ptb_entities(chunk) if formatted else None, api_kwargs=self._stop_kwargs,
            ),
            paced=False,
        )

    async def _quietly(self, chunk: Rendered) -> None:
        try:
            await self._draft(chunk, formatted=False)
            self._drafted = True
        except ChannelError as exc:
            self._disable(exc)

    def _disable(self, exc: Exception) -> None:
        log.warning("telegram chat %s: drafts disabled for this reply: %s", self._target.chat_id, exc)
        self._enabled = False


class EditStream:
    """Groups and topics (and `streaming: edit`): one message edited as the reply grows."""

    posts_messages = True  # its progress is a message in the chat (the outbox records the intent first)

    def __init__(
        self, outlet: Outlet, target: Target, reply_to: int | None, interval: UpdateInterval, pacer: Pacer,
        adopt: Sequence[int] = (),
    ) -> None:
        self._outlet, self._target, self._reply_to = outlet, target, reply_to
        self._interval, self._pacer = interval, pacer
        # An adopted reply is on screen already: brought up to date at once.
        self._opened = interval.clock() - (interval.interval_s if adopt else 0.0)
        self._ids: list[int] = list(adopt)  # an interrupted reply's messages are edited, not repeated
        self._shown: list[Rendered | None] = [None] * len(self._ids)
        self._latest = ""

    def message_ids(self) -> tuple[str, ...]:
        return tuple(str(i) for i in self._ids)

    def wants_update(self) -> bool:
        return self._interval.due(self._target.chat_id, self._opened)

    def note(self, text: str) -> None:
        self._latest = text

    async def update(self, text: str) -> None:
        self._latest = text
        chat = self._target.chat_id
        slot = self._pacer.try_take(chat) if self._interval.due(chat, self._opened) else None
        if slot is None:
            return  # a later update or finish() shows it
        self._interval.mark(chat)
        with slot:
            try:
                await self._show(chunks_of(text), paced=False)
            except ChannelError as exc:
                if exc.ambiguous or exc.retry_after is not None:
                    # A new message timed out and may be shown, or a flood wait holds the chat:
                    # the outbox decides what follows (the one resend; the hold on every send).
                    raise
                log.warning("telegram chat %s: progress edit failed: %s", chat, exc)

    async def finish(self, text: str) -> Delivered:
        chunks = chunks_of(text)
        await self._show(chunks, paced=True)
        for extra in self._ids[len(chunks):]:  # the reply got shorter than what was shown
            await self._outlet.delete(self._target, extra)
        del self._ids[len(chunks):], self._shown[len(chunks):]
        self._interval.mark(self._target.chat_id)
        return Delivered(tuple(str(i) for i in self._ids))

    async def abort(self) -> None:
        """Leave the last text generated on screen rather than an older one."""
        if self._ids and self._latest:
            try:
                await self._show(chunks_of(self._latest), paced=True)
            except ChannelError as exc:
                log.warning("telegram chat %s: could not show the partial reply: %s", self._target.chat_id, exc)

    async def _show(self, chunks: list[Rendered], *, paced: bool) -> None:
        for n, chunk in enumerate(chunks):
            if n < len(self._ids):
                if self._shown[n] != chunk:
                    await self._outlet.edit_chunk(self._target, self._ids[n], chunk, paced=paced)
                    self._shown[n] = chunk
                continue
            reply = self._reply_to if n == 0 else None
            sent = await self._outlet.send_chunk(self._target, chunk, reply_to=reply)
            self._ids.append(sent.message_id)
            self._shown.append(chunk)
