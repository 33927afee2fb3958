"""Events in: bolt's listeners, over Socket Mode or at POST /slack/events.

Bolt runs the listeners *before* it acknowledges (`process_before_response=True`), so an event
is committed through `submit` before Slack hears 200 (or the socket ack). A failing submit
answers 500 / no ack, and Slack redelivers. People who may not use the assistant get an
ephemeral refusal, sent after the ack.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from slack_bolt.adapter.aiohttp import to_aiohttp_response
from slack_bolt.app.async_app import AsyncApp
from slack_bolt.error import BoltUnhandledRequestError
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse

from gateway.config import SlackConfig
from gateway.events import ButtonPress, ChannelState, InboundEvent, InboundMessage, Submit, SubmitResult, ThreadKey

from .api import Lru, SlackWeb, signature_ok
from .inbound import Candidate, Identity, candidate, press
from .render import escape

log = logging.getLogger(__name__)

REFUSE_USER = "Sorry, you are not allowed to use this assistant."
REFUSE_CHANNEL = "Sorry, this assistant is not enabled in this channel."


class SlackIntake:
    """Bolt's app and its listeners: messages and button presses become inbox events."""

    def __init__(
        self, config: SlackConfig, state: ChannelState, web: SlackWeb, recipients: Lru[ThreadKey, tuple[str, str]]
    ) -> None:
        self._config = config
        self._state = state
        self._web = web
        self._recipients = recipients  # who a streamed answer is for, learnt from the request
        self.app = AsyncApp(
            client=web.client,
            signing_secret=config.signing_secret,
            process_before_response=True,  # listeners (our submit) run before the ack
            logger=log,
            # A request no listener takes (a shortcut, a view, another app's button) is acked and
            # logged as ignored: bolt's 404 made Slack retry it and show the person an error,
            # and over Socket Mode it went unacknowledged.
            raise_error_for_unhandled_request=True,
        )
        self.app.event(re.compile(r".*"))(self._on_event)
        self.app.action(re.compile(r"^gw:"))(self._on_action)
        self.app.error(_unhandled_is_ignored)
        self.submit: Submit | None = None
        self.me: Identity | None = None  # set once auth.test has said who the bot is
        self._tasks: set[asyncio.Task[None]] = set()

    async def drain(self) -> None:
        """Waits (a while) for the refusals still being sent."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=5.0)

    # ---- HTTP Events API -------------------------------------------------------------

    async def handle_http(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = raw.decode("utf-8", errors="replace")
        if not self._signature_ok(body, request):
            return web.json_response({"ok": False, "error": "invalid or stale signature"}, status=401)
        try:
            bolt_request = AsyncBoltRequest(body=body, query=request.query_string, headers=dict(request.headers))
        except (ValueError, TypeError, AttributeError):  # bolt parses the body here
            return web.json_response({"ok": False, "error": "malformed body"}, status=400)
        if not isinstance(bolt_request.body, dict) or not bolt_request.body:
            return web.json_response({"ok": False, "error": "malformed body"}, status=400)
        return await to_aiohttp_response(await self.app.async_dispatch(bolt_request))

    def _signature_ok(self, body: str, request: web.Request) -> bool:
        headers = request.headers
        return signature_ok(
            self._config.signing_secret,
            body,
            headers.get("X-Slack-Request-Timestamp"),
            headers.get("X-Slack-Signature"),
        )

    # ---- listeners -------------------------------------------------------------------

    async def _on_event(self, body: dict[str, Any]) -> None:
        found = candidate(body.get("event"), self._identity())
        if found is None:
            return
        if found.route == "followup" and not await self._continues_thread(found):
            return
        refusal = self._refusal(found.user, found.channel, dm=found.route == "dm")
        if refusal:
            if found.route != "followup" or await self._first_refusal(found):
                self._later(self._ephemeral(found.channel, found.user, refusal, found.thread.thread))
            return
        self._recipients.put(found.thread, (found.user, found.team))
        message = InboundMessage(
            thread=found.thread,
            sender=await self._web.sender(found.user),
            text=found.text,
            event_id=found.event_id,
            attachments=found.attachments,
            message_id=found.ts,
            private=found.route == "dm",
        )
        await self._submit_one(message)

    async def _on_action(self, ack: Callable[[], Awaitable[Any]], body: dict[str, Any]) -> None:
        await ack()  # the response still waits for this listener: the press is committed first
        pressed = press(body)
        if pressed is None:
            return
        refusal = self._refusal(pressed.user, pressed.channel, dm=pressed.channel.startswith("D"))
        if refusal:
            self._later(self._ephemeral(pressed.channel, pressed.user, refusal, pressed.thread.thread))
            return
        event = ButtonPress(
            thread=pressed.thread,
            sender=await self._web.sender(pressed.user, pressed.username),
            token=pressed.token,
            event_id=pressed.event_id,
            message_id=pressed.message_ts,
        )
        result = await self._submit_one(event)
        if result.alert and result.answer:
            self._later(self._ephemeral(pressed.channel, pressed.user, result.answer, pressed.thread.thread))

    def _identity(self) -> Identity:
        if self.me is None:
            raise RuntimeError("the Slack channel received an event before start()")
        return self.me

    async def _continues_thread(self, found: Candidate) -> bool:
        return self._config.thread_followups and await self._state.knows_thread(found.thread)

    def _refusal(self, user: str, channel: str, *, dm: bool) -> str:
        if self._config.allowed_users and user not in self._config.allowed_users:
            return REFUSE_USER
        if not dm and self._config.allowed_channels and channel not in self._config.allowed_channels:
            return REFUSE_CHANNEL
        return ""

    async def _first_refusal(self, found: Candidate) -> bool:
        """Thread chatter by someone not allowed is refused once per thread, not per message."""
        return await self._state.bump_counter(f"slack:refused:{found.thread}:{found.user}") == 1

    async def _submit_one(self, event: InboundEvent) -> SubmitResult:
        if self.submit is None:
            raise RuntimeError("the Slack channel received an event before start()")
        results = await self.submit([event])
        return results[0] if results else SubmitResult(event.event_id)

    def _later(self, work: Awaitable[None]) -> None:
        """Work that must not hold up the ack (ephemeral notes); `drain` waits for it."""

        async def run() -> None:
            try:
                await work
            except Exception:  # the one outer catch of this background task: logged, never left unretrieved
                log.exception("slack: background call failed")

        task = asyncio.create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ephemeral(self, channel: str, user: str, text: str, thread_ts: str) -> None:
        await self._web(
            "chat_postEphemeral",
            pace=channel,
            channel=channel,
            user=user,
            text=escape(text),
            thread_ts=thread_ts or None,
        )


async def _unhandled_is_ignored(error: Exception, body: dict[str, Any]) -> BoltResponse | None:
    if isinstance(error, BoltUnhandledRequestError):
        kind = body.get("type") or (body.get("event") or {}).get("type") or "request"
        log.info("slack: %s ignored: the gateway has no use for it", kind)
        return BoltResponse(status=200, body="")
    log.error("slack: a listener failed: %r", error, exc_info=error)
    return None  # bolt answers 500: Slack retries it
