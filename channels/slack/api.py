"""The Web API side of the Slack channel (slack_sdk): one client, paced calls, clear errors.

`SlackWeb` is the `SlackApi` the rest of the channel calls: a method by its slack_sdk name,
paced per channel when asked, with Slack's error code kept on the raised `SlackCallError`.
Nothing is retried here: the outbox is the one retry layer. A 429's Retry-After is carried on
the error (and pushes the channel's pacer back); a post that timed out is marked ambiguous
(it may have been delivered).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import aiohttp
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.signature import SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from gateway.config import SlackConfig
from gateway.events import ChannelError, FileTooLarge, Sender

from .pacing import ChannelPacer
from .stream import SlackCallError

log = logging.getLogger(__name__)

K = TypeVar("K")
V = TypeVar("V")

DOWNLOAD_TIMEOUT_S = 120.0
# Calls that post a new message: after a timeout they may have been delivered all the same.
POSTING = frozenset({"chat_postMessage", "files_upload_v2", "chat_startStream"})
NAME_LOOKUP_TIMEOUT_S = 1.5  # users.info runs before the ack: half of Slack's 3 s, the commit needs far less
NAME_RETRY_AFTER_S = 300.0  # a user users.info could not describe is asked about again after this
PERMANENT = frozenset(
    {
        "channel_not_found",
        "not_in_channel",
        "is_archived",
        "invalid_auth",
        "not_authed",
        "account_inactive",
        "token_revoked",
        "no_permission",
        "missing_scope",
        "restricted_action",
        "msg_too_long",
        "invalid_blocks",
        "no_text",
        "message_not_found",
        "cant_update_message",
        "user_not_found",
        "invalid_arguments",
        "unknown_method",
        "not_allowed_token_type",
    }
)


class Lru(Generic[K, V]):
    """A small bounded map: in-memory hints must not grow without end."""

    def __init__(self, size: int = 4096):
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        if key in self._items:
            self._items.move_to_end(key)
        return self._items.get(key)

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self._size:
            self._items.popitem(last=False)


def signature_ok(secret: str, body: str, timestamp: str | None, signature: str | None) -> bool:
    """Slack's v0 HMAC over `v0:timestamp:body`, refused when older than 5 minutes.
    Without a secret nothing can be trusted."""
    if not secret or not timestamp or not signature:
        return False
    try:
        return SignatureVerifier(secret).is_valid(body=body, timestamp=timestamp, signature=signature)
    except (TypeError, ValueError):
        return False


def _header_seconds(headers: Any) -> float | None:
    try:
        return float(headers.get("Retry-After", ""))
    except (TypeError, ValueError):
        return None


def _retry_after(error: SlackApiError) -> float | None:
    headers = getattr(error.response, "headers", None) or {}
    for name, value in headers.items():
        if name.lower() == "retry-after":
            value = value[0] if isinstance(value, (list, tuple)) else value
            try:
                return float(value)
            except (TypeError, ValueError):
                return None
    return None


def call_error(method: str, error: SlackApiError) -> SlackCallError:
    data = error.response.data if isinstance(getattr(error.response, "data", None), dict) else {}
    code = str(data.get("error") or "")
    status = getattr(error.response, "status_code", 0)
    limited = status == 429 or code == "ratelimited"
    return SlackCallError(
        f"slack {method}: {code or f'HTTP {status}'}",
        code=code or ("ratelimited" if status == 429 else ""),
        retry_after=_retry_after(error) if limited else None,
        permanent=code in PERMANENT,
    )


# Reads whose rate limit is the app's as a whole, not a channel's: conversations.replies is one
# request a minute (15 messages) for apps outside the Marketplace since the 2025 change. After a
# 429 no call of the method is made until its Retry-After has passed: each caller gets the 429
# at once (and goes on without the read), so a burst of turns never becomes a burst of calls.
HELD_AFTER_429 = frozenset({"conversations_replies"})
HOLD_WITHOUT_RETRY_AFTER_S = 60.0


class SlackWeb:
    def __init__(self, config: SlackConfig, *, clock: Callable[[], float] = time.monotonic):
        # No retry handlers: a retried post after a timeout could post twice, and retries
        # inside retries multiply waits. The outbox decides.
        self.client = AsyncWebClient(token=config.bot_token, base_url=config.api_base_url, retry_handlers=[])
        self.pacer = ChannelPacer(config.send_interval_s, clock=clock)
        self._token = config.bot_token
        self._api_host = (urlsplit(config.api_base_url).hostname or "").lower()
        self._session: aiohttp.ClientSession | None = None
        self._clock = clock
        self._senders: Lru[str, Sender] = Lru()
        self._nameless: Lru[str, float] = Lru()  # user -> when users.info may be asked again
        self._lookups: dict[str, asyncio.Task[Sender | None]] = {}
        self._held: dict[str, float] = {}  # method -> until when it is not called (HELD_AFTER_429)

    async def open(self) -> None:
        """One HTTP session for every call (the client would otherwise open one per call)."""
        if self.client.session is None:
            self._session = aiohttp.ClientSession()
            self.client.session = self._session

    async def close(self) -> None:
        for lookup in list(self._lookups.values()):
            lookup.cancel()
        if self._session is not None:
            await self._session.close()
            self.client.session = None
            self._session = None

    async def __call__(self, method: str, *, pace: str | None = None, **params: Any) -> dict[str, Any]:
        held = self._held.get(method, 0.0) - self._clock()
        if held > 0:
            raise SlackCallError(f"slack {method}: rate limited for {held:.0f} s more", code="ratelimited",
                                 retry_after=held)
        if pace:
            await self.pacer.wait(pace)
        try:
            response = await getattr(self.client, method)(**params)
        except SlackApiError as exc:
            error = call_error(method, exc)
            if error.retry_after is not None and pace:
                self.pacer.defer(pace, error.retry_after)
            if error.code == "ratelimited" and method in HELD_AFTER_429:
                self._held[method] = self._clock() + (error.retry_after or HOLD_WITHOUT_RETRY_AFTER_S)
            raise error from exc
        except SlackClientError as exc:
            raise SlackCallError(f"slack {method}: {exc}", permanent=True) from exc
        except TimeoutError as exc:  # the request may have reached Slack
            raise SlackCallError(f"slack {method}: timed out", ambiguous=method in POSTING) from exc
        except aiohttp.ClientError as exc:
            raise SlackCallError(f"slack {method}: {type(exc).__name__}: {exc}") from exc
        return response.data if isinstance(response.data, dict) else {}

    async def download(self, url: str, max_bytes: int) -> bytes:
        """A file's bytes from `url_private`, with the bot token. The token goes only to Slack
        (or to the API host configured), never to a host a payload names."""
        if not self._may_carry_token(url):
            raise ChannelError(f"slack: not downloading {url!r}: not a Slack file URL", permanent=True)
        await self.open()
        session = self.client.session
        if session is None:
            raise ChannelError("slack: no HTTP session for the download")
        headers = {"Authorization": f"Bearer {self._token}"}
        try:
            async with session.get(
                url, headers=headers, timeout=aiohttp.ClientTimeout(total=DOWNLOAD_TIMEOUT_S)
            ) as response:
                if response.status == 429:
                    raise ChannelError(
                        "slack file download: rate limited", retry_after=_header_seconds(response.headers)
                    )
                if response.status >= 500:
                    raise ChannelError(f"slack file download: HTTP {response.status}")
                if response.status != 200:
                    raise ChannelError(f"slack file download: HTTP {response.status}", permanent=True)
                if response.content_type == "text/html":
                    # Without a valid token (or the files:read scope) Slack answers with its login page.
                    raise ChannelError(
                        "slack answered the download with a sign-in page: the bot token needs files:read",
                        permanent=True,
                    )
                if (response.content_length or 0) > max_bytes:
                    raise FileTooLarge(
                        f"slack: the file is {response.content_length} bytes", size=response.content_length or 0
                    )
                data = await _read_body(response, max_bytes)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ChannelError(f"slack file download: {type(exc).__name__}: {exc}") from exc
        return data

    def _may_carry_token(self, url: str) -> bool:
        host = (urlsplit(url).hostname or "").lower()
        return host == "slack.com" or host.endswith(".slack.com") or host == self._api_host

    async def sender(self, user: str, fallback: str = "") -> Sender:
        """The user with a display name (cached); `fallback` (or the bare id) when users.info
        cannot say in time. A slow lookup goes on after the ack's budget and fills the cache for
        the next event; a fallback is never cached, so one slow moment does not name a person by
        their id until a restart."""
        known = self._senders.get(user)
        if known is not None:
            return known
        unnamed = Sender(user, fallback, fallback)
        retry_at = self._nameless.get(user)
        if retry_at is not None and self._clock() < retry_at:
            return unnamed
        lookup = self._lookups.get(user)
        if lookup is None:
            lookup = asyncio.create_task(self._look_up(user))
            self._lookups[user] = lookup
            lookup.add_done_callback(lambda _done: self._lookups.pop(user, None))
        try:
            found = await asyncio.wait_for(asyncio.shield(lookup), NAME_LOOKUP_TIMEOUT_S)
        except TimeoutError:
            log.info("slack: users.info for %s is slow; named %r until it answers", user, fallback or user)
            return unnamed
        return found or unnamed

    async def _look_up(self, user: str) -> Sender | None:
        try:
            response = await self.client.users_info(user=user)
        except (TimeoutError, SlackClientError, aiohttp.ClientError) as exc:
            log.info("slack: no name for %s (%s)", user, exc)
            self._nameless.put(user, self._clock() + NAME_RETRY_AFTER_S)
            return None
        info = response.get("user") or {}
        profile = info.get("profile") or {}
        name = profile.get("display_name") or profile.get("real_name") or info.get("real_name") or info.get("name")
        if not name:
            self._nameless.put(user, self._clock() + NAME_RETRY_AFTER_S)
            return None
        sender = Sender(user, str(name), str(info.get("name") or name))
        self._senders.put(user, sender)
        return sender


async def _read_body(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The whole body, read to its end in chunks (one `read(n)` returns only what has arrived
    so far: a streamed 3 MB file came back as its first 100 KB), stopping as soon as it passes
    `max_bytes`. A body shorter than its Content-Length is a broken transfer, worth a retry."""
    body = bytearray()
    async for chunk in response.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > max_bytes:
            raise FileTooLarge(f"slack: the file is over {max_bytes} bytes", size=len(body))
    expected = response.content_length
    if expected is not None and len(body) != expected:
        raise ChannelError(f"slack file download: {len(body)} of {expected} bytes arrived")
    return bytes(body)
