"""Replies shown while they are generated: native Slack streams, edited messages, or nothing.

`native` uses chat.startStream / appendStream / stopStream (Slack renders the Markdown);
`edit` posts the first chunk and chat.updates it at most once per interval, spilling into
further messages past the chunk limit; `off` posts once at the end. A native stream that the
workspace refuses falls back to editing.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from gateway.events import ChannelError, Delivered, ReplyStream, ThreadKey, previews_allowed

from .render import render_chunks

log = logging.getLogger(__name__)

# chat.startStream / appendStream take markdown_text up to 12,000 characters; a streamed
# message is kept below that and anything longer is laid out as chunks at the end.
NATIVE_CAP = 10_000
# Errors that say the workspace or app cannot stream at all (rather than this one call failed).
UNSUPPORTED = frozenset(
    {"unknown_method", "missing_scope", "not_allowed_token_type", "not_allowed", "feature_not_enabled",
     "method_deprecated", "team_not_allowed", "access_denied", "not_authorized"}
)


class SlackCallError(ChannelError):
    """A Slack Web API call failed; `code` is Slack's error string (e.g. "missing_scope")."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "",
        retry_after: float | None = None,
        permanent: bool = False,
        ambiguous: bool = False,
    ):
        super().__init__(message, retry_after=retry_after, permanent=permanent, ambiguous=ambiguous)
        self.code = code


class SlackApi(Protocol):
    """A Web API call by its slack_sdk method name, paced per channel when `pace` is given."""

    async def __call__(self, method: str, *, pace: str | None = None, **params: Any) -> dict[str, Any]: ...


class Unfurls:
    """A SlackApi that sets chat.postMessage's `unfurl_links`/`unfurl_media` by
    `slack.link_previews`: an unfurl is Slack fetching the link, with whatever the model put
    into its URL, so under `own` only a message whose links all came from the person's own
    message unfurls (`all` leaves Slack's defaults). chat.startStream has no such switch."""

    def __init__(self, api: SlackApi, policy: str, own: Sequence[str] = ()):
        self._api = api
        self._policy = policy
        self._own = frozenset(own)

    async def __call__(self, method: str, *, pace: str | None = None, **params: Any) -> dict[str, Any]:
        if method == "chat_postMessage" and self._policy != "all":
            allowed = previews_allowed(self._policy, str(params.get("text") or ""), self._own)
            params.setdefault("unfurl_links", allowed)
            params.setdefault("unfurl_media", allowed)
        return await self._api(method, pace=pace, **params)


async def post_chunks(api: SlackApi, thread: ThreadKey, chunks: list[str], already: Sequence[str] = ()) -> list[str]:
    """Post mrkdwn chunks into the thread (never the channel top level when there is one).
    The first `len(already)` were posted by an earlier attempt; a failure part way carries
    the ids posted so far, so the retry continues from there."""
    ids = list(already[: len(chunks)])
    for chunk in chunks[len(ids):]:
        try:
            response = await api("chat_postMessage", pace=thread.chat, channel=thread.chat, text=chunk,
                                 thread_ts=thread.thread or None)
        except ChannelError as exc:
            exc.delivered = tuple(ids)
            raise
        ids.append(str(response["ts"]))
    return ids


class PostAtEndStream:
    """`off`: nothing is shown until the reply is complete."""

    def __init__(self, api: SlackApi, thread: ThreadKey):
        self._api = api
        self._thread = thread

    def wants_update(self) -> bool:
        return False

    async def update(self, text: str) -> None:
        return None

    async def finish(self, text: str) -> Delivered:
        return Delivered(tuple(await post_chunks(self._api, self._thread, render_chunks(text))))

    async def abort(self) -> None:
        return None

    def message_ids(self) -> tuple[str, ...]:
        return ()


class EditStream:
    """`edit`: post, then chat.update at most once per `interval`, then a final update."""

    posts_messages = True  # its progress is a message in the thread (the outbox records the intent first)

    def __init__(
        self,
        api: SlackApi,
        thread: ThreadKey,
        clock: Callable[[], float],
        interval: float = 1.0,
        adopt: Sequence[str] = (),
    ):
        self._api = api
        self._thread = thread
        self._clock = clock
        self._interval = interval
        self._ids: list[str] = list(adopt)  # an interrupted reply's messages are edited, not repeated
        self._shown: list[str | None] = [None] * len(self._ids)
        self._last = float("-inf")
        self._latest = ""

    def wants_update(self) -> bool:
        return self._clock() - self._last >= self._interval

    def note(self, text: str) -> None:
        self._latest = text

    async def update(self, text: str) -> None:
        self._latest = text
        if not text.strip() or self._clock() - self._last < self._interval:
            return
        await self._sync(render_chunks(text), final=False)

    async def finish(self, text: str) -> Delivered:
        await self._sync(render_chunks(text), final=True)
        return Delivered(tuple(self._ids))

    async def abort(self) -> None:
        if self._ids:  # leave what was written, brought up to date
            await self._sync(render_chunks(self._latest), final=False)

    def message_ids(self) -> tuple[str, ...]:
        return tuple(self._ids)

    async def _sync(self, chunks: list[str], *, final: bool) -> None:
        channel = self._thread.chat
        for index, chunk in enumerate(chunks):
            if index < len(self._ids):
                if self._shown[index] != chunk:
                    await self._api("chat_update", pace=channel, channel=channel, ts=self._ids[index], text=chunk)
                    self._shown[index] = chunk
            else:
                self._ids.extend(await post_chunks(self._api, self._thread, [chunk]))
                self._shown.append(chunk)
        if final:
            for ts in self._ids[len(chunks):]:  # the text shrank: drop messages it no longer needs
                await self._api("chat_delete", pace=channel, channel=channel, ts=ts)
            del self._ids[len(chunks):], self._shown[len(chunks):]
        self._last = self._clock()


class NativeStream:
    """`native`: chat.startStream on the first text, appendStream deltas, stopStream at the end."""

    posts_messages = True  # chat.startStream posts the message it streams into

    def __init__(
        self,
        api: SlackApi,
        thread: ThreadKey,
        recipient: tuple[str, str] | None,
        clock: Callable[[], float],
        interval: float = 1.0,
        find_recipient: Callable[[], Awaitable[tuple[str, str] | None]] | None = None,
        continues: str = "",
        closing_blocks: Sequence[dict[str, Any]] = (),
    ):
        self._api = api
        self._thread = thread
        self._recipient = recipient
        self._find_recipient = find_recipient  # when this process did not see who asked
        self._clock = clock
        self._interval = interval
        # A stream already open in the thread (its tool calls' task cards): the text goes under
        # them, as markdown_text chunks like the cards.
        self._ts = continues
        self._as_chunks = bool(continues)
        self._closing_blocks = list(closing_blocks)  # under the finished answer (feedback buttons)
        self._sent = ""
        self._last = float("-inf")
        self._broken = False

    @property
    def started(self) -> bool:
        return bool(self._ts)

    def wants_update(self) -> bool:
        return not self._ts or (not self._broken and self._clock() - self._last >= self._interval)

    async def update(self, text: str) -> None:
        if not text.strip():
            return
        if not self._ts:
            await self._start(text[:NATIVE_CAP])
        elif not self._broken and self._clock() - self._last >= self._interval:
            await self._append(text)

    async def _start(self, text: str) -> None:
        params: dict[str, Any] = {"channel": self._thread.chat, "thread_ts": self._thread.thread}
        if text:
            params["markdown_text"] = text
        if self._recipient is None and self._find_recipient is not None:
            self._recipient = await self._find_recipient()
        if self._recipient:
            params["recipient_user_id"], params["recipient_team_id"] = self._recipient
        response = await self._api("chat_startStream", pace=self._thread.chat, **params)
        self._ts, self._sent, self._last = str(response["ts"]), text, self._clock()

    async def _append(self, text: str) -> None:
        if not text.startswith(self._sent) or len(text) > NATIVE_CAP or len(text) == len(self._sent):
            return  # a rewrite or an overflow shows at finish
        try:
            await self._api("chat_appendStream", channel=self._thread.chat, ts=self._ts,
                            **self._text(text[len(self._sent):]))
        except ChannelError as exc:
            log.warning("slack: appendStream failed, the rest shows at the end: %s", exc)
            self._broken = True
            return
        self._sent, self._last = text, self._clock()

    async def finish(self, text: str) -> Delivered:
        if not self._ts:
            if not text.strip():
                return Delivered(())
            if len(text) > NATIVE_CAP:
                return Delivered(tuple(await post_chunks(self._api, self._thread, render_chunks(text))))
            await self._start(text)
        if not self._broken and text.startswith(self._sent) and len(text) <= NATIVE_CAP:
            delta = text[len(self._sent):]
            if await self._stop(delta, blocks=self._closing_blocks):
                return Delivered((self._ts,))
        else:
            await self._stop("")
        return await self._lay_out(text)

    async def _stop(self, delta: str, blocks: Sequence[dict[str, Any]] = ()) -> bool:
        params: dict[str, Any] = {"channel": self._thread.chat, "ts": self._ts}
        if delta:
            params.update(self._text(delta))
        if blocks:
            params["blocks"] = list(blocks)
        try:
            await self._api("chat_stopStream", **params)
        except ChannelError as exc:
            log.warning("slack: stopStream failed: %s", exc)
            return False
        return True

    def _text(self, delta: str) -> dict[str, Any]:
        if self._as_chunks:
            return {"chunks": [{"type": "markdown_text", "text": delta}]}
        return {"markdown_text": delta}

    async def _lay_out(self, text: str) -> Delivered:
        """The final text as mrkdwn chunks: the streamed message holds the first one."""
        chunks = render_chunks(text) or ["…"]
        channel = self._thread.chat
        await self._api("chat_update", pace=channel, channel=channel, ts=self._ts, text=chunks[0])
        rest = await post_chunks(self._api, self._thread, chunks[1:])
        return Delivered((self._ts, *rest))

    async def abort(self) -> None:
        if self._ts:
            await self._stop("")

    def message_ids(self) -> tuple[str, ...]:
        return ()  # a stopped native stream cannot be continued; the new reply is posted anew


class FallbackStream:
    """Native first; when Slack refuses to start a stream, edit messages instead."""

    posts_messages = True  # its progress is a message in the thread (the outbox records the intent first)

    def __init__(
        self,
        native: NativeStream,
        make_edit: Callable[[], ReplyStream],
        refused: Callable[[SlackCallError], None],
    ):
        self._native = native
        self._active: ReplyStream = native
        self._make_edit = make_edit
        self._refused = refused

    def _fall_back(self, error: SlackCallError) -> bool:
        if self._active is not self._native or self._native.started:
            return False
        log.info("slack: native streaming refused (%s), editing messages instead", error.code or error)
        self._refused(error)
        self._active = self._make_edit()
        return True

    def wants_update(self) -> bool:
        wants = getattr(self._active, "wants_update", None)
        return wants is None or wants()

    def note(self, text: str) -> None:
        note = getattr(self._active, "note", None)
        if note is not None:
            note(text)

    async def update(self, text: str) -> None:
        try:
            await self._active.update(text)
        except SlackCallError as exc:
            if not self._fall_back(exc):
                raise
            await self._active.update(text)

    async def finish(self, text: str) -> Delivered:
        try:
            return await self._active.finish(text)
        except SlackCallError as exc:
            if not self._fall_back(exc):
                raise
            return await self._active.finish(text)

    async def abort(self) -> None:
        await self._active.abort()

    def message_ids(self) -> tuple[str, ...]:
        return self._active.message_ids()
