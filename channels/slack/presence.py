"""The busy sign while a turn runs: a status line in the thread, else 👀 on the message.

Presence is cosmetic: failures are logged, never raised. A team that refuses thread statuses
gets reactions from then on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway.events import ChannelError, ThreadKey

from .api import SlackWeb
from .stream import SlackCallError

log = logging.getLogger(__name__)

STATUS_TEXT = "is thinking…"
# Shown in turn under the status while the agent thinks (assistant.threads.setStatus
# loading_messages); while a tool runs, the status names the tool.
LOADING_MESSAGES = ("Thinking…", "Reading the conversation…", "Working on an answer…")
# Agent sessions (agents.sessions.setStatus): `processing` shows Slack's stop button.
SESSION_BUSY, SESSION_IDLE = "processing", "active"
BUSY_REACTION = "eyes"
_TRANSIENT = frozenset({"ratelimited", "internal_error", "fatal_error", "request_timeout", "service_unavailable"})


class Presence:
    def __init__(self, web: SlackWeb, team: Callable[[], str]) -> None:
        self._web = web
        self._team = team
        self._no_status: set[str] = set()  # teams where assistant.threads.setStatus is refused
        self._no_sessions: set[str] = set()  # teams where agents.sessions.setStatus is refused
        self._processing: set[ThreadKey] = set()  # threads whose session we set to processing

    async def set_busy(self, thread: ThreadKey, busy: bool, reply_to: str = "") -> None:
        await self._session(thread, busy)
        try:
            if thread.thread and self._team() not in self._no_status and await self._set_status(thread, busy):
                return
            await self._react(thread.chat, reply_to, busy)
        except ChannelError as exc:
            log.info("slack: presence update failed in %s: %s", thread, exc)

    async def doing(self, thread: ThreadKey, status: str, loading: tuple[str, ...]) -> None:
        """What the agent is doing now ("is running shell…"), where the thread shows a status."""
        if not thread.thread or self._team() in self._no_status:
            return
        try:
            await self._set_status(thread, True, status, loading)
        except ChannelError as exc:
            log.info("slack: status update failed in %s: %s", thread, exc)

    async def _session(self, thread: ThreadKey, busy: bool) -> None:
        """The thread's agent session: `processing` while a turn runs (Slack then shows its stop
        button, which sends agent_session_stopped), `active` after. Apps not declared as agents
        are refused once and not asked again for the team."""
        if not thread.thread or self._team() in self._no_sessions or (not busy and thread not in self._processing):
            return
        try:
            await self._web("agents_sessions_setStatus", channel_id=thread.chat, thread_ts=thread.thread,
                            status=SESSION_BUSY if busy else SESSION_IDLE)
        except SlackCallError as exc:
            self._processing.discard(thread)
            if exc.code in _TRANSIENT or exc.retry_after is not None:
                log.info("slack: session status not set in %s: %s", thread, exc)
                return
            log.info("slack: agent sessions refused (%s): no stop button for this workspace", exc.code or exc)
            self._no_sessions.add(self._team())
            return
        except ChannelError as exc:
            log.info("slack: session status not set in %s: %s", thread, exc)
            return
        if busy:
            self._processing.add(thread)
        else:
            self._processing.discard(thread)

    async def _set_status(
        self, thread: ThreadKey, busy: bool, status: str = STATUS_TEXT, loading: tuple[str, ...] = LOADING_MESSAGES
    ) -> bool:
        try:
            await self._web(
                "assistant_threads_setStatus",
                channel_id=thread.chat,
                thread_ts=thread.thread,
                status=status if busy else "",
                loading_messages=list(loading) if busy and loading else None,
            )
        except SlackCallError as exc:
            if exc.code in _TRANSIENT or exc.retry_after is not None:
                raise
            log.info("slack: thread status refused (%s); using a reaction from now on", exc.code or exc)
            self._no_status.add(self._team())
            return False
        return True

    async def _react(self, channel: str, ts: str, busy: bool) -> None:
        if not ts:
            return
        method = "reactions_add" if busy else "reactions_remove"
        try:
            await self._web(method, channel=channel, timestamp=ts, name=BUSY_REACTION)
        except SlackCallError as exc:
            if exc.code not in ("already_reacted", "no_reaction"):
                raise
