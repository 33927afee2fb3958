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
BUSY_REACTION = "eyes"
_TRANSIENT = frozenset({"ratelimited", "internal_error", "fatal_error", "request_timeout", "service_unavailable"})


class Presence:
    def __init__(self, web: SlackWeb, team: Callable[[], str]) -> None:
        self._web = web
        self._team = team
        self._no_status: set[str] = set()  # teams where assistant.threads.setStatus is refused

    async def set_busy(self, thread: ThreadKey, busy: bool, reply_to: str = "") -> None:
        try:
            if thread.thread and self._team() not in self._no_status and await self._set_status(thread, busy):
                return
            await self._react(thread.chat, reply_to, busy)
        except ChannelError as exc:
            log.info("slack: presence update failed in %s: %s", thread, exc)

    async def _set_status(self, thread: ThreadKey, busy: bool) -> bool:
        try:
            await self._web(
                "assistant_threads_setStatus",
                channel_id=thread.chat,
                thread_ts=thread.thread,
                status=STATUS_TEXT if busy else "",
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
