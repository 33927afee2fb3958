"""The Slack channel: bolt's AsyncApp in, slack_sdk's AsyncWebClient out.

Events arrive over Socket Mode (when an app token is set) or at POST /slack/events and are
submitted before Slack is acknowledged (`intake.py`). Replies always go into the
conversation's thread. The Web API side is `api.py`, rendering `render.py`, Block Kit
`blocks.py`, payload translation `inbound.py`, streaming `stream.py`, the busy sign
`presence.py`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web
from slack_bolt.adapter.socket_mode.async_handler import AsyncSocketModeHandler

from gateway.config import SlackConfig
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

from .api import Lru, SlackWeb
from .blocks import closed_blocks, feedback_blocks, prompt_blocks
from .inbound import Identity
from .intake import SlackIntake
from .presence import LOADING_MESSAGES, STATUS_TEXT, Presence
from .render import escape, render_chunks
from .stream import (
    UNSUPPORTED,
    EditStream,
    FallbackStream,
    NativeStream,
    PostAtEndStream,
    SlackCallError,
    Unfurls,
    post_chunks,
)
from .tasks import TaskCards

log = logging.getLogger(__name__)

Route = tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]
EVENTS_PATH = "/slack/events"


class SlackChannel:
    """Implements `gateway.events.Channel` for one Slack workspace (one bot token)."""

    name = "slack"

    def __init__(
        self,
        config: SlackConfig,
        state: ChannelState,
        *,
        clock: Callable[[], float] = time.monotonic,
        pair_unlisted: bool = False,
    ):
        """`pair_unlisted`: DMs of people not on `allowed_users` go on to the core (it pairs them)."""
        self._config = config
        self._clock = clock
        self._web = SlackWeb(config, clock=clock)
        self._recipients: Lru[ThreadKey, tuple[str, str]] = Lru()  # who a streamed answer is for
        self._intake = SlackIntake(config, state, self._web, self._recipients, pair_unlisted=pair_unlisted)
        self._presence = Presence(self._web, self._team)
        self._me: Identity | None = None
        self._dms: dict[str, str] = {}  # user id -> their DM channel with the bot
        # The blocks of the prompts this process sent (ts -> blocks): a decided prompt is closed
        # without reading it back; after a restart it is read with conversations.replies.
        self._prompt_blocks: Lru[str, list[dict[str, Any]]] = Lru()
        self._socket: AsyncSocketModeHandler | None = None
        self._no_native_stream: set[str] = set()  # teams that refused chat.startStream
        self._tasks = TaskCards(
            Unfurls(self._web, config.link_previews),
            config.task_cards,
            self._task_recipient,
            self._stream_refused,
            lambda: config.streaming in ("auto", "native") and self._team() not in self._no_native_stream,
        )

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self, submit: Submit) -> None:
        self._intake.submit = submit
        await self._web.open()
        try:
            auth = await self._web("auth_test")
        except SlackCallError as exc:
            raise start_failure(exc, "slack.bot_token (SLACK_BOT_TOKEN)", self._config.api_base_url) from exc
        self._me = Identity(str(auth.get("user_id", "")), str(auth.get("bot_id") or ""), str(auth.get("team_id") or ""))
        self._intake.me = self._me
        log.info("slack: signed in as %s in team %s", self._me.bot_user_id, self._me.team_id)
        if self._config.app_token:
            await self._connect_socket()

    async def _connect_socket(self) -> None:
        """Socket Mode: no public URL. The first URL is fetched here so a bad app token fails
        start() clearly instead of retrying in the background."""
        try:
            opened = await self._web("apps_connections_open", app_token=self._config.app_token)
        except SlackCallError as exc:
            raise start_failure(exc, "slack.app_token (SLACK_APP_TOKEN)", self._config.api_base_url) from exc
        handler = AsyncSocketModeHandler(
            self._intake.app, app_token=self._config.app_token, web_client=self._web.client
        )
        handler.client.wss_uri = str(opened["url"])
        self._socket = handler
        await handler.connect_async()

    async def stop(self) -> None:
        if self._socket is not None:
            await self._socket.close_async()
            self._socket = None
        await self._intake.drain()
        await self._web.close()

    def routes(self) -> list[Route]:
        return [("POST", EVENTS_PATH, self.handle_http)]

    async def handle_http(self, request: web.Request) -> web.StreamResponse:
        return await self._intake.handle_http(request)

    # ---- outbound --------------------------------------------------------------------

    async def fetch_file(self, attachment: Attachment, max_bytes: int) -> Fetched:
        if attachment.url:
            return Fetched(await self._web.download(attachment.url, max_bytes))
        # Still being processed when the message came: files.info has it now.
        info = (await self._web("files_info", file=attachment.file_id)).get("file") or {}
        url = str(info.get("url_private_download") or info.get("url_private") or "")
        if not url:
            raise ChannelError(f"slack: file {attachment.file_id} has no download URL yet")
        data = await self._web.download(url, max_bytes)
        return Fetched(data, name=str(info.get("name") or ""), mime=str(info.get("mimetype") or ""))

    async def _direct(self, thread: ThreadKey) -> ThreadKey:
        """A thread addressed to a person (`slack:U…`, an admin's DM) -> their DM channel, which
        conversations.open finds or creates (messages are only edited there by its D… id)."""
        if not thread.chat.startswith(("U", "W")):
            return thread
        channel = self._dms.get(thread.chat)
        if channel is None:
            response = await self._web("conversations_open", users=thread.chat)
            channel = self._dms[thread.chat] = str(response["channel"]["id"])
        return ThreadKey(thread.channel, channel, thread.thread)

    async def send(self, message: Outbound) -> Delivered:
        if message.file is not None:
            file = message.file
            response = await self._web(
                "files_upload_v2",
                pace=message.thread.chat,
                channel=message.thread.chat,
                thread_ts=message.thread.thread or None,
                file=file.path,
                filename=file.name,
                title=file.name,
                initial_comment=escape(file.caption) if file.caption else None,
            )
            return Delivered(tuple(str(f.get("id", "")) for f in response.get("files") or ()))
        chunks = render_chunks(message.text)
        if not chunks and message.document is None:
            raise ChannelError("nothing to send: the message is empty", permanent=True)
        thread = await self._direct(message.thread)
        ids = await post_chunks(self._unfurls(message.links), thread, chunks, message.already)
        if message.document is not None and len(message.already) <= len(chunks):
            name, content = message.document
            try:
                await self._upload(thread, name, content)
            except ChannelError as exc:
                exc.delivered = tuple(ids)
                raise
        return Delivered(tuple(ids))

    async def _upload(self, thread: ThreadKey, name: str, content: str, snippet_type: str | None = None) -> str:
        response = await self._web(
            "files_upload_v2",
            pace=thread.chat,
            channel=thread.chat,
            thread_ts=thread.thread or None,
            filename=name,
            title=name,
            content=content,
            snippet_type=snippet_type,
        )
        files = response.get("files") or [{}]
        return str(files[0].get("id", ""))

    async def send_prompt(self, prompt: Prompt) -> Delivered:
        rendered = prompt_blocks(prompt)
        thread = await self._direct(prompt.thread)
        response = await self._unfurls()(
            "chat_postMessage",
            pace=thread.chat,
            channel=thread.chat,
            thread_ts=thread.thread or None,
            text=rendered.text,
            blocks=rendered.blocks,
        )
        self._prompt_blocks.put(str(response["ts"]), rendered.blocks)
        if rendered.omitted:
            await self._upload_arguments(prompt)
        return Delivered((str(response["ts"]),))

    async def _upload_arguments(self, prompt: Prompt) -> None:
        name = f"{prompt.tool_name or 'tool'}-arguments.json"
        try:
            await self._upload(prompt.thread, name, prompt.arguments, snippet_type="json")
        except ChannelError as exc:  # the prompt is out; its buttons work without the snippet
            log.warning("slack: could not attach the full arguments of %s: %s", prompt.key, exc)

    async def close_prompt(self, thread: ThreadKey, message_ids: Sequence[str], outcome: str) -> None:
        thread = await self._direct(thread)
        for ts in message_ids:
            sent = self._prompt_blocks.get(ts)
            blocks = closed_blocks(sent if sent is not None else await self._message_blocks(thread, ts), outcome)
            await self._web(
                "chat_update", pace=thread.chat, channel=thread.chat, ts=ts, text=escape(outcome), blocks=blocks
            )

    async def _message_blocks(self, thread: ThreadKey, ts: str) -> list[dict[str, Any]] | None:
        """The prompt's blocks as Slack holds them (works after a restart, unlike a cache)."""
        try:
            response = await self._web(
                "conversations_replies",
                channel=thread.chat,
                ts=thread.thread or ts,
                oldest=ts,
                latest=ts,
                inclusive=True,
                limit=10,
            )
        except ChannelError as exc:
            log.warning("slack: could not read prompt %s to close it: %s", ts, exc)
            return None
        for message in response.get("messages") or []:
            if message.get("ts") == ts:
                return list(message.get("blocks") or [])
        return None

    # ---- streaming and presence ------------------------------------------------------

    def open_stream(
        self, thread: ThreadKey, reply_to: str = "", adopt: Sequence[str] = (), links: Sequence[str] = ()
    ) -> ReplyStream:
        mode = self._config.streaming
        interval = self._config.stream_interval_s
        api = self._unfurls(links)
        if adopt:  # finish a reply a restart interrupted, in its own messages
            return EditStream(api, thread, self._clock, interval, adopt=adopt)

        def edit() -> ReplyStream:
            return EditStream(api, thread, self._clock, interval)

        if mode == "off":
            return PostAtEndStream(api, thread)
        refused_here = mode == "auto" and self._team() in self._no_native_stream
        if mode == "edit" or not thread.thread or refused_here:  # native streams live in threads
            return edit()
        native = NativeStream(
            api,
            thread,
            self._recipients.get(thread),
            self._clock,
            interval,
            find_recipient=lambda: self._recipient_of(thread, reply_to),
            continues=self._tasks.take(thread),
            closing_blocks=feedback_blocks() if self._config.feedback_buttons else (),
        )
        return FallbackStream(native, edit, self._stream_refused if mode == "auto" else lambda error: None)

    def _unfurls(self, links: Sequence[str] = ()) -> Unfurls:
        return Unfurls(self._web, self._config.link_previews, links)

    async def _recipient_of(self, thread: ThreadKey, reply_to: str) -> tuple[str, str] | None:
        """Who a reply streamed into a channel is for (Slack requires it there) when this process
        did not receive the request (a restart, or another instance took the event): the author
        of the triggering message, else of the thread's first message."""
        if thread.chat.startswith("D"):
            return None  # a DM needs no recipient
        ts = reply_to or thread.thread
        try:
            response = await self._web(
                "conversations_replies",
                channel=thread.chat,
                ts=thread.thread,
                oldest=ts,
                latest=ts,
                inclusive=True,
                limit=1,
            )
        except ChannelError as exc:
            log.info("slack: cannot tell who %s is for: %s", thread, exc)
            return None
        for message in response.get("messages") or []:
            if message.get("ts") == ts and message.get("user"):
                found = (str(message["user"]), str(message.get("team") or self._team()))
                self._recipients.put(thread, found)
                return found
        return None

    async def _task_recipient(self, thread: ThreadKey) -> tuple[str, str] | None:
        return self._recipients.get(thread) or await self._recipient_of(thread, "")

    async def show_task(self, thread: ThreadKey, task_id: str, title: str, status: str, details: str = "") -> None:
        """A tool call as a task card in the thread's native stream (`slack.task_cards`), and in
        the thread's status line while it runs."""
        if status == "in_progress":
            await self._presence.doing(thread, f"is running {title}…", (f"Running {title}…",))
        elif status in ("complete", "error"):
            await self._presence.doing(thread, STATUS_TEXT, LOADING_MESSAGES)
        await self._tasks.show(thread, task_id, title, status, details)

    def _team(self) -> str:
        return self._me.team_id if self._me else ""

    def _stream_refused(self, error: SlackCallError) -> None:
        if error.code in UNSUPPORTED:
            self._no_native_stream.add(self._team())

    async def set_busy(self, thread: ThreadKey, busy: bool, reply_to: str = "") -> None:
        """A status line in the thread where the app may set one, else 👀 on the message; at
        the end, task cards no reply took are stopped."""
        if not busy:
            await self._tasks.close(thread)
        await self._presence.set_busy(thread, busy, reply_to)


# Slack's answers to a token it does not take (https://api.slack.com/methods/auth.test#errors).
_TOKEN_REFUSED = frozenset(
    {"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired", "not_allowed_token_type"}
)


def start_failure(error: SlackCallError, setting: str, base_url: str) -> ChannelStartError:
    """The one line a start that Slack refused (or could not be reached for) ends with."""
    variable = setting.partition("(")[2].rstrip(")")
    if error.code in _TOKEN_REFUSED:
        kind = "an xapp- app-level token with connections:write" if "APP" in variable else "the xoxb- bot token"
        return ChannelStartError(
            f"{setting}: Slack refused the token ({error.code}): set {variable} to {kind} of your Slack app",
            kind="token_rejected",
        )
    if error.code:
        return ChannelStartError(f"{setting}: Slack answered {error.code}: check the app's settings and {variable}",
                                 kind="channel_settings")
    return ChannelStartError(
        f"slack: cannot reach the Slack API at {base_url} ({str(error).partition(': ')[2] or error}): check this "
        "machine's network (and HTTPS_PROXY if it needs one), or correct slack.api_base_url",
        kind="platform_unreachable",
    )
