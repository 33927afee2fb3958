"""Files in and out: getFile and the download from `api_file_url`, sendPhoto / sendVoice /
sendDocument (a file from the workspace, or a long text sent as a document).

Downloads are not retried here: the core retries them with backoff and records each attempt,
so this module only says whether a failure is worth retrying.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Literal

from telegram import Bot, InputFile, Message

from channels.telegram.api import BotCaller, Rejected, log_rejection, translated
from channels.telegram.inbound import BOT_API_DOWNLOAD_LIMIT
from channels.telegram.outlet import NO_PREVIEW, Target
from gateway.events import Attachment, Fetched, FileTooLarge, OutboundFile

log = logging.getLogger("channels.telegram")
CAPTION_LIMIT = 1024  # characters of a photo or document caption


async def fetch(bot: Bot, attachment: Attachment, max_bytes: int) -> Fetched:
    limit = min(max_bytes, BOT_API_DOWNLOAD_LIMIT)
    try:
        file = await translated("getFile", lambda: bot.get_file(attachment.file_id))
        if (file.file_size or 0) > limit:
            raise FileTooLarge(f"telegram: the file is {file.file_size} bytes, over {limit}", size=file.file_size or 0)
        # network errors and 5xx come as plain ChannelErrors: worth another attempt
        data = bytes(await translated("file download", file.download_as_bytearray))
    except Rejected as exc:
        if "too big" in exc.reason.lower():
            raise FileTooLarge(f"telegram: {exc.reason}", size=attachment.size) from exc
        raise
    if len(data) > limit:
        raise FileTooLarge(f"telegram: the file is {len(data)} bytes, over {limit}", size=len(data))
    return Fetched(data)


async def send_file(
    bot: Bot, caller: BotCaller, target: Target, file: OutboundFile, reply_to: int | None
) -> list[int]:
    """The file (a photo inline, a voice note, else a document) with its caption; a caption
    over Telegram's limit is sent after it as text. A photo or a voice note Telegram refuses as
    such (a person may forbid voice notes: VOICE_MESSAGES_FORBIDDEN) goes as a document."""
    caption, rest = file.caption[:CAPTION_LIMIT], file.caption[CAPTION_LIMIT:]
    data = Path(file.path).read_bytes()
    sent: Message | None = None
    if file.kind in ("photo", "voice"):
        method: Literal["sendPhoto", "sendVoice"] = "sendPhoto" if file.kind == "photo" else "sendVoice"
        try:
            sent = await _send_file_as(method, bot, caller, target, data, file.name, caption, reply_to)
        except Rejected as exc:
            log.info("telegram: %s refused %s (%s); sending it as a document", method, file.name, exc.reason)
    if sent is None:
        try:
            sent = await _send_file_as("sendDocument", bot, caller, target, data, file.name, caption, reply_to)
        except Rejected as exc:
            log_rejection("sendDocument", target.chat_id, exc)
            raise
    ids = [sent.message_id]
    if rest:
        sent_rest = await caller.call(
            "sendMessage",
            target.chat_id,
            lambda: bot.send_message(  # the model's caption: no preview fetches its links
                target.chat_id, rest, message_thread_id=target.thread_id, link_preview_options=NO_PREVIEW
            ),
        )
        ids.append(sent_rest.message_id)
    return ids


async def _send_file_as(
    method: Literal["sendPhoto", "sendVoice", "sendDocument"],
    bot: Bot,
    caller: BotCaller,
    target: Target,
    data: bytes,
    name: str,
    caption: str,
    reply_to: int | None,
) -> Message:
    """The file by sendPhoto, sendVoice or sendDocument: the calls differ only in the name of the file argument."""
    sends: dict[str, Callable[..., Awaitable[Message]]] = {
        "sendPhoto": bot.send_photo, "sendVoice": bot.send_voice, "sendDocument": bot.send_document
    }
    send = sends[method]
    return await caller.call(
        method,
        target.chat_id,
        lambda: send(
            target.chat_id,
            InputFile(data, filename=name),
            caption=caption or None,
            message_thread_id=target.thread_id,
            reply_to_message_id=reply_to,
        ),
    )


async def send_text_document(bot: Bot, caller: BotCaller, target: Target, name: str, content: str) -> int:
    """A text attached in full as a file (an outbound document, an approval's long arguments)."""
    sent: Message = await caller.call(
        "sendDocument",
        target.chat_id,
        lambda: bot.send_document(
            target.chat_id, InputFile(content.encode(), filename=name), message_thread_id=target.thread_id
        ),
    )
    return sent.message_id
