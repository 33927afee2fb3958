"""Sending and editing rendered text in one chat (or topic).

Formatting rejected by Telegram ("can't parse entities") is resent as plain text; an
edit that changes nothing ("message is not modified") counts as done.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from telegram import Bot, InlineKeyboardMarkup, LinkPreviewOptions, Message, ReplyParameters

from channels.telegram.api import BotCaller, Rejected, log_rejection, ptb_entities
from channels.telegram.render import Rendered, render_markdown
from channels.telegram.split import split_rendered
from gateway.events import ChannelError, ThreadKey, previews_allowed

log = logging.getLogger("channels.telegram")


@dataclass(frozen=True)
class Target:
    chat_id: int
    thread_id: int | None  # forum topic

    @property
    def is_private(self) -> bool:
        return self.chat_id > 0  # Telegram: users have positive ids, groups negative

    @classmethod
    def of(cls, thread: ThreadKey) -> Target:
        try:
            chat_id = int(thread.chat)
            topic = int(thread.thread) if thread.thread else None
        except ValueError:
            raise ChannelError(f"not a Telegram thread: {thread}", permanent=True) from None
        return cls(chat_id, topic)


def chunks_of(markdown: str) -> list[Rendered]:
    return split_rendered(render_markdown(markdown))


NO_PREVIEW = LinkPreviewOptions(is_disabled=True)


class Outlet:
    """`previews` is `telegram.link_previews`; `own_links` the links of the person's message
    being answered (`with_links`): a chunk shows a preview only when the policy allows it."""

    def __init__(self, bot: Bot, caller: BotCaller, previews: str = "own") -> None:
        self.bot = bot
        self.caller = caller
        self.previews = previews
        self.own_links: tuple[str, ...] = ()

    def with_links(self, links: Sequence[str]) -> Outlet:
        bound = copy.copy(self)
        bound.own_links = tuple(links)
        return bound

    def preview(self, chunk: Rendered) -> LinkPreviewOptions | None:
        """None leaves Telegram's default (a preview of the first link); otherwise no preview:
        a preview is a request to the link's host, with whatever the model put into the URL."""
        hidden = [e.url for e in chunk.entities if e.url]
        return None if previews_allowed(self.previews, chunk.text, self.own_links, hidden) else NO_PREVIEW

    async def send_chunk(
        self,
        target: Target,
        chunk: Rendered,
        *,
        reply_to: int | None = None,
        markup: InlineKeyboardMarkup | None = None,
    ) -> Message:
        reply = ReplyParameters(reply_to, allow_sending_without_reply=True) if reply_to else None

        def request(formatted: bool):
            return lambda: self.bot.send_message(
                target.chat_id, chunk.text, entities=ptb_entities(chunk) if formatted else None,
                message_thread_id=target.thread_id, reply_parameters=reply, reply_markup=markup,
                link_preview_options=self.preview(chunk),
            )

        try:
            return await self.caller.call("sendMessage", target.chat_id, request(True))
        except Rejected as exc:
            if not exc.parse_error:
                log_rejection("sendMessage", target.chat_id, exc)
                raise
            log.warning("telegram chat %s rejected formatting (%s); sending plain text", target.chat_id, exc.reason)
            try:
                return await self.caller.call("sendMessage", target.chat_id, request(False))
            except Rejected as again:
                log_rejection("sendMessage", target.chat_id, again)
                raise

    async def edit_chunk(
        self,
        target: Target,
        message_id: int,
        chunk: Rendered,
        *,
        markup: InlineKeyboardMarkup | None = None,
        paced: bool = True,
    ) -> None:
        def request(formatted: bool):
            return lambda: self.bot.edit_message_text(
                chunk.text, target.chat_id, message_id,
                entities=ptb_entities(chunk) if formatted else None, reply_markup=markup,
                link_preview_options=self.preview(chunk),
            )

        for formatted in (True, False):
            try:
                await self.caller.call("editMessageText", target.chat_id, request(formatted), paced=paced)
                return
            except Rejected as exc:
                if exc.not_modified:
                    return
                if not (formatted and exc.parse_error):
                    log_rejection("editMessageText", target.chat_id, exc)
                    raise
                log.warning(
                    "telegram chat %s rejected formatting (%s); editing as plain text", target.chat_id, exc.reason
                )

    async def delete(self, target: Target, message_id: int) -> None:
        try:
            await self.caller.call("deleteMessage", target.chat_id,
                                   lambda: self.bot.delete_message(target.chat_id, message_id), paced=False)
        except ChannelError as exc:
            log.warning("telegram chat %s: could not delete message %s: %s", target.chat_id, message_id, exc)

    async def send_chunks(
        self,
        target: Target,
        chunks: list[Rendered],
        *,
        reply_to: int | None = None,
        markup: InlineKeyboardMarkup | None = None,
        already: Sequence[int] = (),
    ) -> list[int]:
        """Send in order; the first replies to `reply_to`, the last carries `markup`. The
        first `len(already)` chunks were posted by an earlier attempt (their ids): skipped. A
        failure part way carries the ids posted so far, so the retry continues from there."""
        ids: list[int] = list(already[: len(chunks)])
        for n, chunk in enumerate(chunks):
            if n < len(ids):
                continue
            last = n == len(chunks) - 1
            try:
                sent = await self.send_chunk(
                    target, chunk, reply_to=reply_to if n == 0 else None, markup=markup if last else None
                )
            except ChannelError as exc:
                exc.delivered = tuple(str(i) for i in ids)
                raise
            ids.append(sent.message_id)
        return ids
