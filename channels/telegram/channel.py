"""The Telegram channel: lifecycle, replies and presence; ingest and prompts are delegated.

Built on python-telegram-bot's bare `Bot` (not `Application`/`Updater`, which confirm
updates before they are processed): `ingest.py` reads updates (long polling or webhook) and
confirms them only after `submit` has stored them; `prompts.py` sends and closes keyboards.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import httpx
from telegram import Bot
from telegram.constants import ChatAction
from telegram.request import HTTPXRequest

from channels.telegram import files, prompts
from channels.telegram.api import CONNECTIONS, BotCaller, Rejected, TokenRejected, translated
from channels.telegram.inbound import ALLOWED_UPDATES, BOT_API_DOWNLOAD_LIMIT, BotIdentity, UpdateReader
from channels.telegram.ingest import SECRET_FORMAT, UpdateIngest
from channels.telegram.outlet import Outlet, Target, chunks_of
from channels.telegram.pacing import Pacer
from channels.telegram.streams import DraftBook, DraftStream, EditStream, FinalOnlyStream, UpdateInterval
from gateway.config import TelegramConfig
from gateway.events import (
    Attachment,
    ChannelError,
    ChannelStartError,
    ChannelState,
    Delivered,
    Fetched,
    Outbound,
    Prompt,
    ReplyStream,
    Submit,
    ThreadKey,
)

if TYPE_CHECKING:
    from aiohttp import web

    Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

log = logging.getLogger("channels.telegram")


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

    def __init__(
        self,
        config: TelegramConfig,
        state: ChannelState,
        *,
        max_download_bytes: int | None = None,
        pair_unlisted: bool = False,
    ) -> None:
        """`max_download_bytes`: the gateway's attachment limit; of a photo's sizes, the largest
        under it (and under the Bot API's own 20 MB) is the one described for download.
        `pair_unlisted`: direct messages of people not on `allowed_users` are not refused
        here but passed on (the core pairs them: an explicit `access.dm_policy`)."""
        self.config = config
        self.pair_unlisted = pair_unlisted
        self.show_tool_progress = config.show_tool_progress
        self.private_prompts = config.group_approvals == "private"  # Prompt.receiver: ephemeral cards
        self.topic_per_conversation = config.new_topic_per_conversation  # /new opens a topic (open_topic)
        self.state = state
        self._max_download = min(max_download_bytes or BOT_API_DOWNLOAD_LIMIT, BOT_API_DOWNLOAD_LIMIT)
        self._pacer = Pacer(config.rate_overall_per_s, config.rate_private_per_s, config.rate_group_per_min)
        self._caller = BotCaller(self._pacer)
        self._sharing = 1  # instances sending for this bot (share_rate_limits)
        self._update_interval = UpdateInterval(config.edit_interval_s)
        self._drafts = DraftBook()  # what a Stop pressed on a draft means
        self._bot: Bot | None = None
        self._outlet: Outlet | None = None
        self._ingest: UpdateIngest | None = None
        self._typing: dict[ThreadKey, asyncio.Task[None]] = {}
        self._redact = _RedactToken(config.token)

    # --- lifecycle ---------------------------------------------------------------

    def _make_bot(self) -> Bot:
        """PTB's Bot with its two connections (updates, everything else) sharing one TLS
        context: loading the trust store costs tens of milliseconds a client. A plain-HTTP Bot
        API server (a local one) never uses TLS: a context without roots, refusing any certificate."""
        https = any(httpx.URL(url).scheme == "https" for url in (self.config.api_base_url, self.config.api_file_url))
        tls = httpx.create_ssl_context() if https else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
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
            raise ChannelStartError(
                "telegram.token (TELEGRAM_BOT_TOKEN): the bot token was rejected by the Bot API: set "
                "TELEGRAM_BOT_TOKEN to the token @BotFather gave (/mybots there shows it again)",
                kind="token_rejected",
            ) from None
        except ChannelError as exc:
            raise self._unreachable(exc) from exc
        me = bot.bot
        self._bot, self._outlet = bot, Outlet(bot, self._caller, self.config.link_previews, rich_in=self._wants_rich)
        if self.config.mode == "webhook":
            await self._set_webhook(bot)
            log.info("telegram: @%s receives updates by webhook at %s", me.username, self.config.webhook_url)
        else:
            await translated("deleteWebhook", lambda: bot.delete_webhook(drop_pending_updates=False))
            log.info("telegram: @%s receives updates by long polling", me.username)
        if self.config.process_edited:
            log.info("telegram: process_edited is no longer read: edits are always handled, as inbox.on_edit says")
        reader = UpdateReader(
            self.config,
            BotIdentity(me.id, me.username or ""),
            max_download_bytes=self._max_download,
            pair_unlisted=self.pair_unlisted,
        )
        self._ingest = UpdateIngest(self.config, self.state, bot, self._outlet, reader, submit, drafts=self._drafts)

    def _unreachable(self, exc: ChannelError) -> ChannelStartError:
        reason = str(exc).removeprefix("telegram getMe: ").replace(self.config.token, "<token>")
        reason = reason.partition(": ")[2] if reason.startswith("httpx.") else reason  # the library's name: noise
        return ChannelStartError(
            f"telegram: cannot reach the Bot API at {self.config.api_base_url} ({reason}): check this machine's "
            "network (and HTTPS_PROXY if it needs one), or correct telegram.api_base_url",
            kind="platform_unreachable",
        )

    async def _set_webhook(self, bot: Bot) -> None:
        try:
            await translated("setWebhook", lambda: bot.set_webhook(
                self.config.webhook_url, secret_token=self.config.webhook_secret, allowed_updates=ALLOWED_UPDATES
            ))
        except Rejected as exc:
            raise ChannelStartError(
                f"telegram.webhook_url: Telegram refused {self.config.webhook_url} ({exc.reason}): give the public "
                "https:// address of this gateway's /telegram/webhook, or set telegram.mode: polling",
                kind="channel_settings",
            ) from exc

    def _check_config(self) -> None:
        if not self.config.token:
            raise ChannelStartError(
                "telegram.token (TELEGRAM_BOT_TOKEN) is empty: set TELEGRAM_BOT_TOKEN", kind="channel_settings"
            )
        if self.config.mode != "webhook":
            return
        polling = "or set telegram.mode: polling (no public URL needed)"
        if not self.config.webhook_secret:
            raise ChannelStartError(
                "telegram.webhook_secret (TELEGRAM_WEBHOOK_SECRET) is not set, and telegram.mode: webhook needs it: "
                f"set TELEGRAM_WEBHOOK_SECRET to a random string (e.g. openssl rand -hex 32), {polling}",
                kind="channel_settings",
            )
        if not SECRET_FORMAT.match(self.config.webhook_secret):
            raise ChannelStartError(
                "telegram.webhook_secret (TELEGRAM_WEBHOOK_SECRET) must be 1-256 characters of A-Z, a-z, 0-9, _ "
                "and -: set TELEGRAM_WEBHOOK_SECRET to e.g. the output of openssl rand -hex 32",
                kind="channel_settings",
            )
        if not self.config.webhook_url.startswith("https://"):
            raise ChannelStartError(
                "telegram.webhook_url is not an https:// URL, and telegram.mode: webhook needs one: set it to the "
                f"public address of this gateway's /telegram/webhook, {polling}",
                kind="channel_settings",
            )

    async def stop(self) -> None:
        for task in self._typing.values():
            task.cancel()
        self._typing.clear()
        for name in _URL_LOGGERS:
            logging.getLogger(name).removeFilter(self._redact)
        if self._bot is not None:
            await self._bot.shutdown()

    def share_rate_limits(self, instances: int) -> None:
        """Telegram limits the bot, not the process: with `instances` sending for it, this one
        sends its share of the overall 30 a second."""
        if instances != self._sharing:
            log.info("telegram: %d instance(s) send for this bot; this one paces to 1/%d of its overall limit",
                     instances, instances)
            self._sharing = instances
            self._pacer.share_among(instances)

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

    # --- ingest ----------------------------------------------------------------------

    async def poll_forever(self) -> None:
        """Long-poll on the leader (`UpdateIngest.poll_forever`)."""
        if self._ingest is None:
            raise RuntimeError("TelegramChannel.start() has not run")
        await self._ingest.poll_forever(self.poll_backoff_s, self.poll_backoff_max_s)

    def routes(self) -> list[tuple[str, str, Handler]]:
        """The webhook's route in webhook mode; none when polling (nothing to receive)."""
        return [("POST", "/telegram/webhook", self.handle_webhook)] if self.config.mode == "webhook" else []

    async def handle_webhook(self, request: web.Request) -> web.Response:
        if self._ingest is None:
            from aiohttp import web

            return web.Response(status=503, text="telegram channel not started")
        return await self._ingest.handle_webhook(request)

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
        outlet = self.outlet.with_links(message.links)
        ids = await outlet.send_reply(target, message.text, chunks, reply_to=anchor, already=done)
        if message.document and len(message.already) <= len(chunks):
            try:
                ids.append(await files.send_text_document(self.bot, self._caller, target, *message.document))
            except ChannelError as exc:
                exc.delivered = tuple(str(i) for i in ids)
                raise
        if not ids:
            log.warning("telegram: nothing to send to chat %s (empty text, key %s)", target.chat_id, message.key)
        return Delivered(tuple(str(i) for i in ids))

    def open_stream(
        self, thread: ThreadKey, reply_to: str = "", adopt: Sequence[str] = (), links: Sequence[str] = ()
    ) -> ReplyStream:
        target = Target.of(thread)
        anchor = self._anchor(target, reply_to)
        mode = self.config.streaming
        outlet = self.outlet.with_links(links)
        if adopt:  # finish a reply a restart interrupted, in its own messages
            adopted = [int(i) for i in adopt]
            return EditStream(outlet, target, anchor, self._update_interval, self._pacer, adopt=adopted)
        if mode == "off":
            return FinalOnlyStream(outlet, target, anchor)
        if mode == "edit" or not target.is_private:
            return EditStream(outlet, target, anchor, self._update_interval, self._pacer)
        return DraftStream(
            outlet, target, anchor, self._update_interval, self._pacer,
            book=self._drafts, stop_button=self.config.stop_button,
        )

    async def _wants_rich(self, chat_id: int) -> bool:
        """The chat's own choice (`/rich on|off`), else `telegram.rich_messages`."""
        chosen = await self.state.chat_choice(f"{self.name}:{chat_id}", "rich")
        return chosen if chosen is not None else self.config.rich_messages == "on"

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
        await asyncio.sleep(self.config.typing_after_s)
        while True:
            slot = self._pacer.spare()
            if slot is None:  # optional: skipped when the bot's budget is taken
                await asyncio.sleep(self.typing_interval_s / 4)
                continue
            with slot:
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

    def stream_stopped(self, thread: ThreadKey, stream: str) -> bool:
        """Stop pressed on draft `stream` (read here or by another instance): its reply keeps
        the text so far (`stop_button: keep`). False when that draft's reply was sent already."""
        if not stream.isdigit() or self._drafts.already_sent(int(stream)):
            return False
        self._drafts.stop(int(stream))
        return True

    # --- topics --------------------------------------------------------------------

    async def open_topic(self, thread: ThreadKey, title: str) -> ThreadKey | None:
        """A new topic named `title` in the chat of `thread` (`createForumTopic`: in a private chat
        when the bot has topics there, Bot API 9.4; in a forum where it may add topics): its
        thread, or None where none can be opened (the caller stays in the chat: `/new` starts over
        there, a job delivers there)."""
        target = Target.of(thread)
        me = self._bot.bot if self._bot is not None else None
        if me is None:
            return None
        if target.is_private and not getattr(me, "has_topics_enabled", False):
            log.info("telegram chat %s: no topic opened: the bot has no topics (BotFather: Threaded Mode)",
                     target.chat_id)
            return None
        try:
            topic = await self._caller.call(
                "createForumTopic", target.chat_id, lambda: self.bot.create_forum_topic(target.chat_id, title[:128])
            )
        except ChannelError as exc:
            log.warning("telegram chat %s: no topic opened: %s", target.chat_id, exc)
            return None
        return ThreadKey(self.name, thread.chat, str(topic.message_thread_id))

    # --- prompts -------------------------------------------------------------------

    async def send_prompt(self, prompt: Prompt) -> Delivered:
        return await prompts.send_prompt(self.outlet, prompt)

    async def close_prompt(self, thread: ThreadKey, message_ids: Sequence[str], outcome: str) -> None:
        await prompts.close_prompt(self.outlet, thread, message_ids, outcome)
