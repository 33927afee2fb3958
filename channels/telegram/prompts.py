"""Prompts with inline keyboards: sent with their buttons, closed with their outcome."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from telegram import InlineKeyboardButton, InlineKeyboardMarkup, Message

from channels.telegram import ephemeral, files
from channels.telegram.api import Rejected
from channels.telegram.layout import approval_body, outcome_line, question_body
from channels.telegram.outlet import Outlet, Target
from channels.telegram.split import split_rendered
from gateway.events import Button, ChannelError, Delivered, Prompt, ThreadKey

log = logging.getLogger("channels.telegram")


async def send_prompt(outlet: Outlet, prompt: Prompt) -> Delivered:
    """The prompt with its inline keyboard; the first id is the message with the buttons
    when the text fits one message (long questions put them on the last chunk)."""
    target = Target.of(prompt.thread)
    markup = keyboard(prompt.buttons)
    if prompt.kind == "approval":
        body, document = approval_body(prompt)
    else:
        body, document = question_body(prompt), None
    if prompt.receiver:
        return await ephemeral.send_card(outlet, target, int(prompt.receiver), split_rendered(body), markup, document)
    ids = await outlet.send_chunks(target, split_rendered(body), markup=markup)
    if document:
        ids.append(await files.send_text_document(outlet.bot, outlet.caller, target, *document))
    return Delivered(tuple(str(i) for i in ids))


async def close_prompt(outlet: Outlet, thread: ThreadKey, message_ids: Sequence[str], outcome: str) -> None:
    """Remove the keyboard and append the outcome. Safe to repeat: a message whose
    keyboard is already gone is left as it is."""
    target = Target.of(thread)
    for raw_id in message_ids:
        if ephemeral.is_ephemeral(raw_id):
            await ephemeral.close_card(outlet, target, raw_id, outcome)
        if not raw_id.isdigit():
            continue
        message = await _drop_keyboard(outlet, target, int(raw_id))
        if isinstance(message, Message) and message.text:
            await _append_outcome(outlet, target, message, outcome)


async def _drop_keyboard(outlet: Outlet, target: Target, message_id: int) -> Message | bool | None:
    try:
        return await outlet.caller.call(
            "editMessageReplyMarkup",
            target.chat_id,
            lambda: outlet.bot.edit_message_reply_markup(target.chat_id, message_id, reply_markup=None),
        )
    except Rejected as exc:
        if not exc.not_modified:
            log.warning("telegram chat %s: cannot close prompt %s: %s", target.chat_id, message_id, exc.reason)
        return None


async def _append_outcome(outlet: Outlet, target: Target, message: Message, outcome: str) -> None:
    text = outcome_line(message.text or "", outcome)
    try:
        await outlet.caller.call(
            "editMessageText",
            target.chat_id,
            lambda: outlet.bot.edit_message_text(text, target.chat_id, message.message_id, entities=message.entities),
        )
    except Rejected as exc:
        if not exc.not_modified:
            log.warning(
                "telegram chat %s: cannot show the outcome on %s: %s",
                target.chat_id,
                message.message_id,
                exc.reason,
            )


# Bot API 9.4 InlineKeyboardButton.style: green for what goes ahead, red for what refuses
STYLES = {"positive": "success", "negative": "danger"}


def _button(button: Button) -> InlineKeyboardButton:
    if button.url:  # a link: Telegram opens it, no callback comes back
        return InlineKeyboardButton(button.label, url=button.url)
    return InlineKeyboardButton(button.label, callback_data=button.token, style=STYLES.get(button.tone))


def keyboard(rows: tuple[tuple[Button, ...], ...]) -> InlineKeyboardMarkup | None:
    for row in rows:
        for button in row:
            size = len(button.token.encode())
            if not 1 <= size <= 64:
                raise ChannelError(
                    f"telegram: button token of {size} bytes ({button.label!r}); Telegram accepts 1-64", permanent=True
                )
    shown = [[_button(b) for b in row] for row in rows if row]
    return InlineKeyboardMarkup(shown) if shown else None
