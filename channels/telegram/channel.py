"""The Telegram channel: ingest (long polling or webhook), replies, prompts, presence.

Built on python-telegram-bot's bare `Bot` (not `Application`/`Updater`, which confirm
updates before they are processed). An update is confirmed to Telegram only after
`submit` has stored it: by the next getUpdates offset, or by the webhook's 200.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

import httpx
from aiohttp import web
from telegram import (
    Bot,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    InputFile,
    Message,
    Update,
)
from telegram.constants import ChatAction
from telegram.request import HTTPXRequest

from channels.telegram import files
from channels.telegram.api import CONNECTIONS, BotCaller, Conflicted, Pacer, Rejected, TokenRejected, translated
from channels.telegram.inbound import (
    ALLOWED_UPDATES,
    BotIdentity,
    Reading,
    UpdateReader,
)
from channels.telegram.layout import approval_body, outcome_line, question_body
from channels.telegram.outlet import Outlet, Target, chunks_of
from channels.telegram.split import split_rendered
from channels.telegram.streams import DraftStream, EditStream, FinalOnlyStream, Throttle
from gateway.config import TelegramConfig
from gateway.events import (
    Attachment,
    Button,
    ChannelError,
    ChannelState,
    Delivered,
    Fetched,
    Outbound,
    Prompt,
    ReplyStream,
    Submit,
    SubmitResult,
    ThreadKey,
)

log = logging.getLogger("channels.telegram")
OFFSET_CURSOR = "telegram:offset"
SECRET_HEADER = "X-Telegram-Bot-Api-Secret-Token"
_SECRET_FORMAT = re.compile(r"^[A-Za-z0-9_-]{1,256}$")
REFUSAL = (
    "Sorry, this assistant is private. Your Telegram id is {user_id}:"
    " ask its owner to add it to telegram.allowed_users."
)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# Loggers whose records can carry the bot token: httpx logs request URLs and PTB logs its
# base URL at DEBUG, and Bot API URLs contain the token.
_URL_LOGGERS = ("httpx", "telegram.Bot")


class _RedactToken(logging.Filter):
    """Replaces the bot token with <token> in log records."""

    def __init__(self, token: str) -> None:
        super().__init__()
        self._token = token

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self._token in message:
            record.msg, record.args = message.replace(self._token, "<token>"), ()
        return True


class TelegramChannel:
    name = "telegram"
    typing_interval_s = 4.0  # Telegram shows "typing" for about 5 s
    poll_backoff_s = 1.0  # first wait after a failed getUpdates; doubles up to poll_backoff_max_s
    poll_backoff_max_s = 30.0

    def __init__(self, config: TelegramConfig, state: ChannelState) -> None:
        self.config = config
        self.show_tool_progress = config.show_tool_progress
        self.state = state
        self._pacer = Pacer(config.rate_overall_per_s, config.rate_private_per_s, config.rate_group_per_min)
        self._caller = BotCaller(self._pacer)
        self._throttle = Throttle(config.edit_interval_s)
        self._bot: Bot | None = None
        self._outlet: Outlet | None = None
        self._reader: UpdateReader | None = None
        self._submit: Submit | None = None
        self._typing: dict[ThreadKey, asyncio.Task[None]] = {}
        self._redact = _RedactToken(config.token)

    # --- lifecycle ---------------------------------------------------------------

    def _make_bot(self) -> Bot:
        """PTB's Bot with its two connections (updates, everything else) sharing one TLS
        context: loading the trust store costs tens of milliseconds a client."""
        tls = httpx.create_ssl_context()
        return Bot(
            self.config.token, base_url=self.config.api_base_url, base_file_url=self.config.api_file_url,
            request=HTTPXRequest(
                read_timeout=self.config.request_timeout_s, write_timeout=self.config.request_timeout_s,
                connect_timeout=self.config.request_timeout_s, httpx_kwargs={"verify": tls},
                connection_pool_size=CONNECTIONS + 4,  # room for calls made outside BotCaller
            ),
            get_updates_request=HTTPXRequest(connection_pool_size=1, httpx_kwargs={"verify": tls}),
        )

    async def start(self, submit: Submit) -> None:
        """Connect (getMe), then set or delete the webhook by mode. Polling is `poll_forever`."""
        self._check_config()
        for name in _URL_LOGGERS:
            logging.getLogger(name).addFilter(self._redact)
        bot = self._make_bot()
        try:
            await translated("getMe", bot.initialize)
        except TokenRejected:
            raise ChannelError(
                "telegram: the bot token was rejected (check TELEGRAM_BOT_TOKEN)", permanent=True
            ) from None
        except ChannelError as exc:
            raise ChannelError(f"telegram: cannot reach the Bot API at {self.config.api_base_url}: {exc}") from exc
        me = bot.bot
        self._bot, self._outlet = bot, Outlet(bot, self._caller)
        self._reader = UpdateReader(self.config, BotIdentity(me.id, me.username or ""))
        if self.config.mode == "webhook":
            await translated("setWebhook", lambda: bot.set_webhook(
                self.config.webhook_url, secret_token=self.config.webhook_secret, allowed_updates=ALLOWED_UPDATES
            ))
            log.info("telegram: @%s receives updates by webhook at %s", me.username, self.config.webhook_url)
        else:
            await translated("deleteWebhook", lambda: bot.delete_webhook(drop_pending_updates=False))
            log.info("telegram: @%s receives updates by long polling", me.username)
        self._submit = submit

    def _check_config(self) -> None:
        if not self.config.token:
            raise ChannelError("telegram: no bot token (set TELEGRAM_BOT_TOKEN)", permanent=True)
        if self.config.mode != "webhook":
            return
        if not self.config.webhook_secret:
            raise ChannelError(
                "telegram: webhook mode needs telegram.webhook_secret (set TELEGRAM_WEBHOOK_SECRET)", permanent=True
            )
        if not _SECRET_FORMAT.match(self.config.webhook_secret):
            raise ChannelError(
                "telegram: webhook_secret must be 1-256 characters of A-Z, a-z, 0-9, _ and -", permanent=True
            )
        if not self.config.webhook_url.startswith("https://"):
            raise ChannelError(
                "telegram: webhook mode needs telegram.webhook_url (an https:// URL ending in /telegram/webhook)",
                permanent=True,
            )

    async def stop(self) -> None:
        for task in self._typing.values():
            task.cancel()
        self._typing.clear()
        for name in _URL_LOGGERS:
            logging.getLogger(name).removeFilter(self._redact)
        if self._bot is not None:
            await self._bot.shutdown()

    @property
    def bot(self) -> Bot:
        if self._bot is None:
            raise RuntimeError("TelegramChannel.start() has not run")
        return self._bot

    @property
    def outlet(self) -> Outlet:
        if self._outlet is None:
            raise RuntimeError("TelegramChannel.start() has not run")
        return self._outlet

    # --- ingest: polling -----------------------------------------------------------

    async def poll_forever(self) -> None:
        """Long-poll on the leader. Each batch is submitted (with the next offset as the
        cursor) before the next getUpdates, which is what confirms it to Telegram."""
        offset = await self._load_offset()
        failures = 0
        while True:
            try:
                updates = await translated("getUpdates", partial(
                    self.bot.get_updates,
                    offset=offset, timeout=self.config.poll_timeout_s, allowed_updates=ALLOWED_UPDATES,
                ))
                if updates:
                    next_offset = max(u.update_id for u in updates) + 1
                    await self._ingest(updates, cursor=(OFFSET_CURSOR, str(next_offset)))
                    offset = next_offset
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any single failure
                failures += 1
                await self._wait_after_poll_failure(exc, failures)

    async def _load_offset(self) -> int | None:
        stored = await self.state.load_cursor(OFFSET_CURSOR)
        if stored is None:
            return None
        if not stored.isdigit():
            log.warning("telegram: ignoring a stored offset that is not a number: %r", stored)
            return None
        return int(stored)

    async def _wait_after_poll_failure(self, exc: Exception, failures: int) -> None:
        delay = min(self.poll_backoff_s * 2 ** (failures - 1), self.poll_backoff_max_s)
        if isinstance(exc, Conflicted):
            log.error(
                "telegram: 409 Conflict: another process is polling this bot token or a webhook "
                "is set (%s); retrying in %.1fs",
                exc,
                delay,
            )
        elif isinstance(exc, ChannelError) and exc.retry_after is not None:
            delay = max(delay, exc.retry_after)
            log.warning("telegram: getUpdates flood limit; retrying in %.1fs", delay)
        elif isinstance(exc, ChannelError):
            log.warning("telegram: getUpdates failed (%s); retrying in %.1fs", exc, delay)
        else:
            log.exception("telegram: storing a batch of updates failed; it will be read again in %.1fs", delay)
        await asyncio.sleep(delay)

    async def _ingest(self, updates: Sequence[Update], *, cursor: tuple[str, str] | None) -> None:
        if self._submit is None:
            raise RuntimeError("TelegramChannel.start() has not run")
        readings = [self._read(u) for u in updates]
        events = [r.event for r in readings if r.kind == "event" and r.event is not None]
        results = await self._submit(events, cursor=cursor)
        by_id = {r.event_id: r for r in results}
        for reading in readings:
            await self._after_submit(reading, by_id)

    def _read(self, update: Update) -> Reading:
        assert self._reader is not None
        try:
            reading = self._reader.read(update)
        except Exception:
            log.exception("telegram: update %s could not be read; skipped", update.update_id)
            return Reading("ignore", update.update_id, text="unreadable")
        if reading.kind == "ignore":
            log.debug("telegram: update %s ignored: %s", update.update_id, reading.text)
        return reading

    async def _after_submit(self, reading: Reading, results: dict[str, SubmitResult]) -> None:
        if reading.kind == "refuse":
            await self._refuse(reading)
        elif reading.kind == "answer":
            await self._answer_callback(reading.callback_id, reading.text, alert=bool(reading.text))
        elif reading.callback_id and reading.event is not None:
            result = results.get(reading.event.event_id)
            answer, alert = (result.answer, result.alert) if result else ("", False)
            await self._answer_callback(reading.callback_id, answer, alert=alert)

    async def _refuse(self, reading: Reading) -> None:
        """One short refusal per private chat per day; the counter is all that is stored."""
        count = await self.state.bump_counter(f"telegram:refused:{reading.chat_id}:{reading.day}")
        log.info("telegram: refused user %s in chat %s (%s today)", reading.user_id, reading.chat_id, count)
        if count != 1:
            return
        try:
            await self.outlet.send_chunk(
                Target(reading.chat_id, None), chunks_of(REFUSAL.format(user_id=reading.user_id))[0]
            )
        except ChannelError as exc:
            log.warning("telegram: could not send the refusal to chat %s: %s", reading.chat_id, exc)

    async def _answer_callback(self, query_id: str, text: str, *, alert: bool) -> None:
        try:
            await translated(
                "answerCallbackQuery",
                lambda: self.bot.answer_callback_query(query_id, text=text[:200] or None, show_alert=alert),
            )
        except ChannelError as exc:  # an old query (> 15 min) can no longer be answered
            log.warning("telegram: could not answer callback %s: %s", query_id, exc)

    # --- ingest: webhook -----------------------------------------------------------

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [("POST", "/telegram/webhook", self.handle_webhook)]

    async def handle_webhook(self, request: web.Request) -> web.Response:
        if self._submit is None or self._bot is None:
            return web.Response(status=503, text="telegram channel not started")
        if not self._secret_matches(request.headers.get(SECRET_HEADER, "")):
            log.warning("telegram: webhook call from %s with a missing or wrong secret", request.remote)
            return web.Response(status=401, text="wrong or missing secret token")
        update = self._parse_update(await request.read())
        if isinstance(update, str):
            log.warning("telegram: malformed webhook body: %s", update)
            return web.Response(status=400, text=update)
        try:
            await self._ingest([update], cursor=None)
        except Exception:
            log.exception("telegram: storing webhook update %s failed", update.update_id)
            return web.Response(status=500, text="not stored, retry")
        return web.Response(status=200, text="ok")

    def _secret_matches(self, given: str) -> bool:
        expected = self.config.webhook_secret
        return bool(expected) and hmac.compare_digest(given.encode(), expected.encode())

    def _parse_update(self, body: bytes) -> Update | str:
        """The update, or why the body is not one."""
        try:
            data: Any = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return "body is not JSON"
        if not isinstance(data, dict) or not isinstance(data.get("update_id"), int):
            return "not a Telegram update (no integer update_id)"
        try:
            return Update.de_json(data, self._bot)
        except Exception as exc:  # noqa: BLE001 - PTB raises various errors on odd payloads
            return f"not a Telegram update: {exc}"

    # --- replies -------------------------------------------------------------------

    def _anchor(self, target: Target, reply_to: str) -> int | None:
        """Replies quote the triggering message in groups only (in private chats it is noise)."""
        return int(reply_to) if reply_to.isdigit() and not target.is_private else None

    async def fetch_file(self, attachment: Attachment, max_bytes: int) -> Fetched:
        return await files.fetch(self.bot, attachment, max_bytes)

    async def send(self, message: Outbound) -> Delivered:
        target = Target.of(message.thread)
        if message.file is not None:
            anchor = self._anchor(target, message.reply_to)
            return Delivered(
                tuple(str(i) for i in await files.send_file(self.bot, self._caller, target, message.file, anchor))
            )
        chunks = chunks_of(message.text)
        done = [int(i) for i in message.already if i.isdigit()]
        anchor = self._anchor(target, message.reply_to)
        ids = await self.outlet.send_chunks(target, chunks, reply_to=anchor, already=done)
        if message.document and len(message.already) <= len(chunks):
            try:
                ids.append(await self._send_document(target, *message.document))
            except ChannelError as exc:
                exc.delivered = tuple(str(i) for i in ids)
                raise
        if not ids:
            log.warning("telegram: nothing to send to chat %s (empty text, key %s)", target.chat_id, message.key)
        return Delivered(tuple(str(i) for i in ids))

    async def _send_document(self, target: Target, name: str, content: str) -> int:
        sent: Message = await self._caller.call(
            "sendDocument",
            target.chat_id,
            lambda: self.bot.send_document(
                target.chat_id, InputFile(content.encode(), filename=name), message_thread_id=target.thread_id
            ),
        )
        return sent.message_id

    def open_stream(self, thread: ThreadKey, reply_to: str = "", adopt: Sequence[str] = ()) -> ReplyStream:
        target = Target.of(thread)
        anchor = self._anchor(target, reply_to)
        mode = self.config.streaming
        if adopt:  # finish a reply a restart interrupted, in its own messages
            return EditStream(self.outlet, target, anchor, self._throttle, self._pacer, adopt=[int(i) for i in adopt])
        if mode == "off":
            return FinalOnlyStream(self.outlet, target, anchor)
        if mode == "edit" or not target.is_private:
            return EditStream(self.outlet, target, anchor, self._throttle, self._pacer)
        return DraftStream(self.outlet, target, anchor, self._throttle, self._pacer)

    async def set_busy(self, thread: ThreadKey, busy: bool, reply_to: str = "") -> None:
        if not busy:
            task = self._typing.pop(thread, None)
            if task is not None:
                task.cancel()
            return
        if thread in self._typing and not self._typing[thread].done():
            return
        self._typing[thread] = asyncio.create_task(self._keep_typing(Target.of(thread)))

    async def _keep_typing(self, target: Target) -> None:
        while True:
            if not self._pacer.spare():  # optional: skipped when the bot's budget is taken
                await asyncio.sleep(self.typing_interval_s / 4)
                continue
            try:
                await self._caller.call(
                    "sendChatAction",
                    target.chat_id,
                    lambda: self.bot.send_chat_action(
                        target.chat_id, ChatAction.TYPING, message_thread_id=target.thread_id
                    ),
                    paced=False,
                )
            except ChannelError as exc:
                log.debug("telegram chat %s: typing not shown: %s", target.chat_id, exc)
            await asyncio.sleep(self.typing_interval_s)

    # --- prompts -------------------------------------------------------------------

    async def send_prompt(self, prompt: Prompt) -> Delivered:
        """The prompt with its inline keyboard; the first id is the message with the buttons
        when the text fits one message (long questions put them on the last chunk)."""
        target = Target.of(prompt.thread)
        markup = keyboard(prompt.buttons)
        if prompt.kind == "approval":
            body, document = approval_body(prompt)
        else:
            body, document = question_body(prompt), None
        ids = await self.outlet.send_chunks(target, split_rendered(body), markup=markup)
        if document:
            ids.append(await self._send_document(target, *document))
        return Delivered(tuple(str(i) for i in ids))

    async def close_prompt(self, thread: ThreadKey, message_ids: Sequence[str], outcome: str) -> None:
        """Remove the keyboard and append the outcome. Safe to repeat: a message whose
        keyboard is already gone is left as it is."""
        target = Target.of(thread)
        for raw_id in message_ids:
            if not raw_id.isdigit():
                continue
            message = await self._drop_keyboard(target, int(raw_id))
            if isinstance(message, Message) and message.text:
                await self._append_outcome(target, message, outcome)

    async def _drop_keyboard(self, target: Target, message_id: int) -> Message | bool | None:
        try:
            return await self._caller.call(
                "editMessageReplyMarkup",
                target.chat_id,
                lambda: self.bot.edit_message_reply_markup(target.chat_id, message_id, reply_markup=None),
            )
        except Rejected as exc:
            if not exc.not_modified:
                log.warning("telegram chat %s: cannot close prompt %s: %s", target.chat_id, message_id, exc.reason)
            return None

    async def _append_outcome(self, target: Target, message: Message, outcome: str) -> None:
        text = outcome_line(message.text or "", outcome)
        try:
            await self._caller.call(
                "editMessageText",
                target.chat_id,
                lambda: self.bot.edit_message_text(text, target.chat_id, message.message_id, entities=message.entities),
            )
        except Rejected as exc:
            if not exc.not_modified:
                log.warning(
                    "telegram chat %s: cannot show the outcome on %s: %s",
                    target.chat_id,
                    message.message_id,
                    exc.reason,
                )


def keyboard(rows: tuple[tuple[Button, ...], ...]) -> InlineKeyboardMarkup | None:
    for row in rows:
        for button in row:
            size = len(button.token.encode())
            if not 1 <= size <= 64:
                raise ChannelError(
                    f"telegram: button token of {size} bytes ({button.label!r}); Telegram accepts 1-64", permanent=True
                )
    shown = [[InlineKeyboardButton(b.label, callback_data=b.token) for b in row] for row in rows if row]
    return InlineKeyboardMarkup(shown) if shown else None
