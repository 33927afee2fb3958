"""A decider's own approval card in a group, which nobody else there sees (Bot API 10.2-10.3
ephemeral messages; `telegram.group_approvals: private`).

An ephemeral message has an id of its own, kept here as "ephemeral:<receiver>:<id>" among
the prompt's message ids, and is edited and deleted by its own methods. Telegram does not
guarantee that an offline person gets it, nor its later edits, so the core sends the DM copy
as well and a tap on a card left standing is answered like any stale button.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from telegram import InlineKeyboardMarkup, InputFile, Message

from channels.telegram.api import Rejected, ptb_entities
from channels.telegram.outlet import NO_PREVIEW, Outlet, Target
from channels.telegram.render import Rendered
from gateway.events import ChannelError, Delivered

log = logging.getLogger("channels.telegram")

PREFIX = "ephemeral:"


def is_ephemeral(message_id: str) -> bool:
    return message_id.startswith(PREFIX)


async def send_card(
    outlet: Outlet,
    target: Target,
    receiver: int,
    chunks: list[Rendered],
    markup: InlineKeyboardMarkup | None,
    document: tuple[str, str] | None,
) -> Delivered:
    """The card's chunks (the buttons on the last) and its arguments file, shown to `receiver` only."""
    if target.is_private:
        raise ChannelError(f"telegram chat {target.chat_id}: an ephemeral card belongs in a group", permanent=True)
    only_them = {"ephemeral_message_parameters": {"receiver_user_id": receiver}}
    ids: list[str] = []
    for n, chunk in enumerate(chunks):
        last = n == len(chunks) - 1
        ids.append(_id_of(await _send_text(outlet, target, chunk, markup if last else None, only_them), receiver))
    if document:
        name, content = document
        sent = await outlet.caller.call(
            "sendDocument",
            target.chat_id,
            lambda: outlet.bot.send_document(
                target.chat_id, InputFile(content.encode(), filename=name), message_thread_id=target.thread_id,
                api_kwargs=only_them,
            ),
        )
        ids.append(_id_of(sent, receiver))
    return Delivered(tuple(ids))


async def _send_text(
    outlet: Outlet, target: Target, chunk: Rendered, markup: InlineKeyboardMarkup | None, extra: dict[str, Any]
) -> Message:
    def request(formatted: bool):
        return lambda: outlet.bot.send_message(
            target.chat_id, chunk.text, entities=ptb_entities(chunk) if formatted else None,
            message_thread_id=target.thread_id, reply_markup=markup, link_preview_options=NO_PREVIEW,
            api_kwargs=extra,
        )

    try:
        return await outlet.caller.call("sendMessage", target.chat_id, request(True))
    except Rejected as exc:
        if not exc.parse_error:
            raise
        return await outlet.caller.call("sendMessage", target.chat_id, request(False))


def _id_of(sent: Message, receiver: int) -> str:
    """"ephemeral:<receiver>:<id>"; a server older than 10.3 ignores the parameter and posts an
    ordinary message, whose id is kept as one (so closing the prompt closes it too)."""
    ephemeral_id = sent.api_kwargs.get("ephemeral_message_id")
    if isinstance(ephemeral_id, int):
        return f"{PREFIX}{receiver}:{ephemeral_id}"
    log.warning(
        "telegram chat %s: the Bot API posted the card for %s as an ordinary message (older than 10.3?): "
        "the group sees it; set telegram.group_approvals: shared to post one card only", sent.chat_id, receiver,
    )
    return str(sent.message_id)


async def close_card(outlet: Outlet, target: Target, raw_id: str, outcome: str) -> None:
    """The card becomes its outcome ("✅ Approved by Ann"), its buttons gone. Best effort: the
    person may never get the edit, and a tap on the old card is answered as stale."""
    receiver, _, ephemeral_id = raw_id.removeprefix(PREFIX).partition(":")
    params = {
        "chat_id": target.chat_id,
        "receiver_user_id": int(receiver),
        "ephemeral_message_id": int(ephemeral_id),
        "text": outcome,
    }

    async def request() -> Any:
        with warnings.catch_warnings():  # newer than the library: called by name
            warnings.simplefilter("ignore")
            return await outlet.bot.do_api_request("editEphemeralMessageText", api_kwargs=params)

    try:
        await outlet.caller.call("editEphemeralMessageText", target.chat_id, request)
    except Rejected as exc:  # gone, or never delivered: retrying cannot help (a 429 or a timeout is retried)
        log.info("telegram chat %s: the card of %s was not closed: %s", target.chat_id, receiver, exc.reason)
