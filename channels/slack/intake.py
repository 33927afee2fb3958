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
from gateway.events import (
    ButtonPress,
    ChannelError,
    ChannelState,
    InboundEvent,
    InboundMessage,
    MessageDeleted,
    Quoted,
    Reaction,
    StoreUnwritable,
    Submit,
    SubmitResult,
    ThreadKey,
)

from .api import Lru, SlackWeb, signature_ok
from .blocks import FEEDBACK_ACTION
from .inbound import (
    Candidate,
    Identity,
    app_home_dm,
    assistant_thread,
    candidate,
    changed_message,
    deletion,
    press,
    rating,
    reacted,
    text_for_model,
    why_not,
)
from .render import escape

log = logging.getLogger(__name__)

REFUSE_USER = "Sorry, you are not allowed to use this assistant."
REFUSE_CHANNEL = "Sorry, this assistant is not enabled in this channel."
EARLIER_IN_THREAD = 20  # messages of a thread before the agent's first mention there, given as context


class SlackIntake:
    """Bolt's app and its listeners: messages and button presses become inbox events."""

    def __init__(
        self,
        config: SlackConfig,
        state: ChannelState,
        web: SlackWeb,
        recipients: Lru[ThreadKey, tuple[str, str]],
        *,
        pair_unlisted: bool = False,
    ) -> None:
        self._config = config
        self._pair_unlisted = pair_unlisted
        self._state = state
        self._web = web
        self._recipients = recipients  # who a streamed answer is for, learnt from the request
        self._dm_threads = config.app_view == "agent"  # the agent view: each DM message is a thread
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
        self.app.action(FEEDBACK_ACTION)(self._on_rating)
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
        event = body.get("event")
        special = self._special(event) if isinstance(event, dict) else None
        if special is not None and isinstance(event, dict):
            return await special(body, event)
        dm_threads = self._dm_threads
        found = candidate(event, self._identity(), chatter=self._config.channel_context > 0, dm_threads=dm_threads)
        if found is None:
            log.debug("slack: event %s ignored: %s", body.get("event_id", ""), why_not(event, self._identity()))
            return
        if found.route == "chatter":
            return await self._keep_chatter(found)
        if found.route == "followup" and not await self._continues_thread(found):
            return _ignored(body, "a message in a thread the bot is not in, without a mention")
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
            context=await self._earlier_in_thread(found),
            surroundings=self._surroundings(found),
        )
        await self._submit_one(message)

    def _special(self, event: dict[str, Any]) -> Callable[[dict[str, Any], dict[str, Any]], Awaitable[None]] | None:
        """The listener of an event that is not a person's new message, if it is one."""
        kind, subtype = event.get("type"), event.get("subtype")
        if kind in ("reaction_added", "reaction_removed"):
            return self._on_reaction
        if subtype == "message_changed":
            return self._on_edit
        if subtype == "message_deleted":
            return self._on_delete
        if kind == "agent_session_stopped":
            return self._on_stop
        if kind in ("app_home_opened", "assistant_thread_started"):
            return self._on_opened
        if kind == "app_context_changed":
            return self._on_context
        return None

    async def _on_context(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        """What the person is looking at in Slack (agent view). Not given to the model: a
        channel is read only where the agent is mentioned and that channel is allowed."""
        _ignored(body, "the person's view changed (not used)")

    # ---- the conversation around a message ---------------------------------------------

    def _surroundings(self, found: Candidate) -> ThreadKey | None:
        """A mention at the top of a channel takes the channel's kept chatter as context."""
        if self._config.channel_context and found.route == "mention" and found.thread.thread == found.ts:
            return ThreadKey("slack", found.channel, "")
        return None

    async def _earlier_in_thread(self, found: Candidate) -> tuple[Quoted, ...]:
        """A first mention in a thread that was going on without the agent: the thread so far."""
        if found.route != "mention" or found.thread.thread in ("", found.ts):
            return ()
        if await self._state.knows_thread(found.thread):
            return ()
        # Read once per thread: a retried or second early mention (before the session exists)
        # does not read it again (conversations.replies may allow one call a minute).
        if await self._state.bump_counter(f"slack:hydrated:{found.thread}") > 1:
            return ()
        try:
            response = await self._web(
                "conversations_replies",
                channel=found.channel,
                ts=found.thread.thread,
                latest=found.ts,
                inclusive=False,
                limit=200,
            )
        except ChannelError as exc:
            log.info("slack: could not read the thread %s before the mention: %s", found.thread, exc)
            return ()
        me = self._identity()
        earlier = [m for m in response.get("messages") or () if float(m.get("ts") or 0) < float(found.ts)]
        quoted = []
        for message in earlier[-EARLIER_IN_THREAD:]:
            text = text_for_model(str(message.get("text") or ""), me.bot_user_id)
            mine = message.get("user") == me.bot_user_id or bool(me.bot_id and message.get("bot_id") == me.bot_id)
            if not text:
                continue
            if mine or not message.get("user"):
                who = "" if mine else str(message.get("username") or "a bot")
            else:
                who = (await self._web.sender(str(message["user"]))).name
            who_id = "" if mine else str(message.get("user") or "")
            quoted.append(Quoted(who, text, from_bot=mine, relation="thread", who_id=who_id))
        return tuple(quoted)

    async def _keep_chatter(self, found: Candidate) -> None:
        if self._refusal(found.user, found.channel, dm=False):
            return
        await self._submit_one(self._message(found, await self._web.sender(found.user), keep=True))

    def _message(
        self, found: Candidate, sender: Any, *, keep: bool, event_id: str = "", edit_of: str = ""
    ) -> InboundMessage:
        return InboundMessage(
            thread=found.thread,
            sender=sender,
            text=found.text,
            event_id=event_id or found.event_id,
            attachments=() if keep else found.attachments,
            message_id=found.ts,
            private=found.route == "dm",
            edit_of=edit_of,
            context_keep=self._config.channel_context if keep else 0,
        )

    # ---- revisions: edits, deletions, reactions ------------------------------------------

    @staticmethod
    def _event_id(body: dict[str, Any], event: dict[str, Any], kind: str) -> str:
        """Slack's own id of the event (an edit or a reaction has no message ts of its own)."""
        if body.get("event_id"):
            return f"slack:event:{body['event_id']}"
        return f"slack:{kind}:{event.get('channel') or ''}:{event.get('event_ts') or event.get('ts') or ''}"

    async def _on_edit(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        shaped = changed_message(event)
        found = (
            candidate(shaped, self._identity(), chatter=self._config.channel_context > 0, dm_threads=self._dm_threads)
            if shaped else None
        )
        if found is None:
            return _ignored(body, "an edit that changed no text, or of a message not for the bot")
        if found.route == "followup" and not await self._continues_thread(found):
            return _ignored(body, "an edit in a thread the bot is not in")
        if self._refusal(found.user, found.channel, dm=found.route == "dm"):
            return _ignored(body, "an edit by someone not allowed here")
        sender = await self._web.sender(found.user)
        event_id = self._event_id(body, event, "changed")
        await self._submit_one(
            self._message(found, sender, keep=found.route == "chatter", event_id=event_id, edit_of=found.ts)
        )

    async def _on_delete(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        deleted = deletion(event, self._dm_threads)
        if deleted is None:
            return _ignored(body, "a deletion without the message it deleted")
        await self._submit_one(MessageDeleted(deleted.thread, deleted.ts, self._event_id(body, event, "deleted")))

    async def _on_opened(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        """A person opened the conversation with the agent: the agent view's Messages tab
        (`app_home_opened`, `tab: messages`; the prompts are set without a thread_ts, which an
        agent app's call must not carry) or an assistant-view thread (`assistant_thread_started`,
        with its thread_ts). Shows `slack.suggested_prompts`; cosmetic, failures are logged."""
        prompts = self._config.suggested_prompts
        opened = app_home_dm(event) if self._dm_threads else None  # an older app's DM has no such place
        started = assistant_thread(event)
        where = (started[0], started[2]) if started else opened
        if not prompts or where is None:
            return _ignored(body, "no suggested prompts to show, or not the conversation with the agent")
        channel, user = where
        if self._config.allowed_users and user not in self._config.allowed_users:  # not even to pair
            return _ignored(body, "opened by someone not allowed here")
        params: dict[str, Any] = {"channel_id": channel, "prompts": [p.model_dump() for p in prompts]}
        if started:
            params["thread_ts"] = started[1]
        if self._config.suggested_prompts_title:
            params["title"] = self._config.suggested_prompts_title
        self._later(self._suggest(params))

    async def _suggest(self, params: dict[str, Any]) -> None:
        try:
            await self._web("assistant_threads_setSuggestedPrompts", **params)
        except ChannelError as exc:
            log.info("slack: suggested prompts not shown in %s: %s", params["channel_id"], exc)

    async def _on_stop(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        """Slack's stop button, shown while the thread's agent session is `processing`
        (`agent_session_stopped`: channel, thread_ts, user, streaming_message_ts): the /stop of
        the person who pressed it, in that thread, so the run is cancelled as /stop cancels it
        (the core decides whether they may stop it)."""
        channel, thread_ts, user = (str(event.get(k) or "") for k in ("channel", "thread_ts", "user"))
        if not channel or not thread_ts or not user:
            return _ignored(body, "a stop without its channel, thread or person")
        if self._refusal(user, channel, dm=channel.startswith("D")):
            return _ignored(body, "a stop by someone not allowed here")
        stop = InboundMessage(
            thread=ThreadKey("slack", channel, thread_ts),
            sender=await self._web.sender(user),
            text="/stop",
            event_id=self._event_id(body, event, "stopped"),
            private=channel.startswith("D"),
        )
        await self._submit_one(stop)

    async def _on_reaction(self, body: dict[str, Any], event: dict[str, Any]) -> None:
        found = reacted(event, self._identity())
        if found is None:
            return _ignored(body, "not a 👍/👎 on a message in a channel")
        if self._refusal(found.user, found.channel, dm=found.channel.startswith("D")):
            return _ignored(body, "a reaction by someone not allowed here")
        change = (found.feedback,)
        reaction = Reaction(
            ThreadKey("slack", found.channel, ""),
            await self._web.sender(found.user),
            found.ts,
            self._event_id(body, event, "reaction"),
            added=change if found.added else (),
            removed=() if found.added else change,
        )
        await self._submit_one(reaction)

    async def _on_action(self, ack: Callable[[], Awaitable[Any]], body: dict[str, Any]) -> None:
        await ack()  # the response still waits for this listener: the press is committed first
        pressed = press(body)
        if pressed is None:
            return _ignored(body, "a button press without its message or value")
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

    async def _on_rating(self, ack: Callable[[], Awaitable[Any]], body: dict[str, Any]) -> None:
        """👍 / 👎 pressed under an answer: the same feedback as a reaction (committed before the ack)."""
        await ack()
        rated = rating(body)
        if rated is None:
            return _ignored(body, "a feedback press without its message, person or a known value")
        if self._refusal(rated.user, rated.channel, dm=rated.channel.startswith("D")):
            return _ignored(body, "feedback by someone not allowed here")
        await self._submit_one(
            Reaction(
                ThreadKey("slack", rated.channel, ""),
                await self._web.sender(rated.user, rated.username),
                rated.ts,
                rated.event_id,
                added=(rated.feedback,),
            )
        )

    def _identity(self) -> Identity:
        if self.me is None:
            raise RuntimeError("the Slack channel received an event before start()")
        return self.me

    async def _continues_thread(self, found: Candidate) -> bool:
        return self._config.thread_followups and await self._state.knows_thread(found.thread)

    def _refusal(self, user: str, channel: str, *, dm: bool) -> str:
        unlisted = bool(self._config.allowed_users) and user not in self._config.allowed_users
        if unlisted and not (dm and self._pair_unlisted):
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
    if isinstance(error, StoreUnwritable):  # the core said why, once
        log.debug("slack: %s not stored (%s): Slack delivers it again", body.get("event_id") or "request", error)
        return BoltResponse(status=503, body="not stored, retry")
    log.error("slack: a listener failed: %r", error, exc_info=error)
    return None  # bolt answers 500: Slack retries it


def _ignored(body: dict[str, Any], why: str) -> None:
    event: dict[str, Any] = body["event"] if isinstance(body.get("event"), dict) else {}
    kind = "/".join(str(p) for p in (event.get("type") or body.get("type"), event.get("subtype")) if p)
    log.debug("slack: %s %s ignored: %s", kind or "request", body.get("event_id", ""), why)
