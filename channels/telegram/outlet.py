"""Sending and editing rendered text in one chat (or topic).

Formatting rejected by Telegram ("can't parse entities") is resent as plain text; an
edit that changes nothing ("message is not modified") counts as done.
"""

from __future__ import annotations

import copy
import logging
import re
import warnings
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from telegram import Bot, InlineKeyboardMarkup, LinkPreviewOptions, Message, ReplyParameters

from channels.markdown import DETAILS_LINE, Details, rich_html, sections
from channels.telegram.api import BotCaller, Rejected, log_rejection, ptb_entities
from channels.telegram.render import Rendered, render_markdown
from channels.telegram.split import split_rendered
from gateway.events import ChannelError, ThreadKey, links_in, previews_allowed

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
# What a plain message shows poorly: a table (its delimiter row) or a heading.
_TABLE_RULE = re.compile(r"^ {0,3}\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)+\|?\s*$", re.MULTILINE)
_HEADING = re.compile(r"^ {0,3}#{1,6}\s", re.MULTILINE)


def rich_worthy(markdown: str, chunks: int) -> bool:
    """A reply worth a rich message (Bot API 10.1): one that needs several plain messages, or
    has a table, headings or a collapsible section."""
    return chunks > 1 or any(p.search(markdown) for p in (_TABLE_RULE, _HEADING, DETAILS_LINE))


def rich_content(markdown: str) -> dict[str, str]:
    """InputRichMessage's content: the model's Markdown, which Telegram parses; with a
    collapsible section, HTML made here (`<details>`, RichBlockDetails), since raw HTML in the
    Markdown is not something to hand on: only the sections become tags."""
    if any(isinstance(part, Details) for part in sections(markdown)):
        return {"html": rich_html(markdown)}
    return {"markdown": markdown}


class Outlet:
    """`previews` is `telegram.link_previews`; `own_links` the links of the person's message
    being answered (`with_links`): a chunk shows a preview only when the policy allows it."""

    def __init__(
        self, bot: Bot, caller: BotCaller, previews: str = "own",
        *, rich_in: Callable[[int], Awaitable[bool]] | None = None,
    ) -> None:
        self.bot = bot
        self.caller = caller
        self.previews = previews
        self._rich_in = rich_in  # whether a chat takes rich messages (`/rich`, `telegram.rich_messages`)
        self.own_links: tuple[str, ...] = ()

    async def wants_rich(self, chat_id: int) -> bool:
        return self._rich_in is not None and await self._rich_in(chat_id)

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

    async def send_reply(
        self,
        target: Target,
        markdown: str,
        chunks: list[Rendered],
        *,
        reply_to: int | None = None,
        already: Sequence[int] = (),
    ) -> list[int]:
        """A final reply: one rich message where the chat gets them and the reply is worth one
        (falling back to today's messages when Telegram refuses it), else its chunks."""
        worthy = not already and rich_worthy(markdown, len(chunks)) and self._links_may_preview(markdown)
        if worthy and await self.wants_rich(target.chat_id):
            sent = await self.send_rich(target, markdown, reply_to=reply_to)
            if sent is not None:
                return [sent]
        return await self.send_chunks(target, chunks, reply_to=reply_to, already=already)

    def _links_may_preview(self, markdown: str) -> bool:
        """A rich message has no link_preview_options: it is sent only when it has no link, or
        when `link_previews` would let all of them preview anyway."""
        return not links_in(markdown) or previews_allowed(self.previews, markdown, self.own_links)

    async def send_rich(self, target: Target, markdown: str, *, reply_to: int | None = None) -> int | None:
        """sendRichMessage (Bot API 10.1, newer than the library: called by name) with the
        model's Markdown, which Telegram parses into blocks (tables, headings, lists), or the HTML
        of a reply with collapsible sections (`rich_content`). None when
        Telegram refuses it (the caller sends the reply as plain messages instead)."""
        params: dict[str, Any] = {"chat_id": target.chat_id, "rich_message": rich_content(markdown)}
        if target.thread_id is not None:
            params["message_thread_id"] = target.thread_id
        if reply_to:
            params["reply_parameters"] = {"message_id": reply_to, "allow_sending_without_reply": True}

        async def request() -> Any:
            with warnings.catch_warnings():  # the library would rather we called a method it has
                warnings.simplefilter("ignore")
                return await self.bot.do_api_request("sendRichMessage", api_kwargs=params)

        try:
            result = await self.caller.call("sendRichMessage", target.chat_id, request)
        except Rejected as exc:
            log.warning("telegram chat %s refused a rich message (%s); sending it as text", target.chat_id, exc.reason)
            return None
        if not isinstance(result, dict) or not isinstance(result.get("message_id"), int):
            raise ChannelError(f"telegram sendRichMessage to chat {target.chat_id}: no message in the answer",
                               permanent=True)
        return int(result["message_id"])

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
