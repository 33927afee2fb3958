"""Tool calls as task cards in the thread: "shell  ls -la … ✓" while the agent works.

The first tool call of a turn starts a native stream (`chat.startStream` with a `task_update`
chunk and `task_display_mode` timeline or plan); each later update is a `chat.appendStream`
chunk with the same task id, whose card Slack updates in place. The reply that follows in the
same thread continues that stream (its text under the cards) instead of starting another; when
no reply follows (the turn parked on an approval, failed or was stopped) the stream is stopped
when the turn ends. Task cards are cosmetic: a failure is logged and the cards stop for that
turn; a workspace that cannot stream never shows them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.events import ChannelError, ThreadKey

from .stream import UNSUPPORTED, SlackApi, SlackCallError

log = logging.getLogger(__name__)

STATUSES = frozenset({"pending", "in_progress", "complete", "error"})  # slack_sdk TaskUpdateChunk
TITLE_MAX = 256  # not documented by Slack; kept short so a card stays one line
DETAILS_MAX = 200


def task_chunk(task_id: str, title: str, status: str, details: str = "") -> dict[str, Any]:
    """A `task_update` chunk (fields as slack_sdk's TaskUpdateChunk: id, title, status, details)."""
    if status not in STATUSES:
        raise ValueError(f"unknown task status {status!r}")
    chunk: dict[str, Any] = {"type": "task_update", "id": task_id, "title": _cut(title, TITLE_MAX) or "tool",
                             "status": status}
    if details:
        chunk["details"] = _cut(details, DETAILS_MAX)
    return chunk


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class TaskCards:
    """The open task-card stream of each thread (at most one per thread)."""

    def __init__(
        self,
        api: SlackApi,
        mode: str,
        recipient: Callable[[ThreadKey], Awaitable[tuple[str, str] | None]],
        refused: Callable[[SlackCallError], None],
        can_stream: Callable[[], bool],
    ):
        self._api = api
        self._mode = mode  # timeline | plan | off
        self._recipient = recipient
        self._refused = refused
        self._can_stream = can_stream
        self._open: dict[ThreadKey, str] = {}  # thread -> ts of the stream holding its cards
        self._broken: set[ThreadKey] = set()  # a failed card: no more this turn
        self._locks: dict[ThreadKey, asyncio.Lock] = {}

    def wanted(self, thread: ThreadKey) -> bool:
        return self._mode != "off" and bool(thread.thread) and self._can_stream() and thread not in self._broken

    async def show(self, thread: ThreadKey, task_id: str, title: str, status: str, details: str = "") -> None:
        if not self.wanted(thread):
            return
        chunk = task_chunk(task_id, title, status, details)
        async with self._locks.setdefault(thread, asyncio.Lock()):
            ts = self._open.get(thread)
            try:
                if ts is None:
                    await self._start(thread, chunk)
                else:
                    await self._api("chat_appendStream", channel=thread.chat, ts=ts, chunks=[chunk])
            except ChannelError as exc:
                log.info("slack: task card in %s not shown: %s", thread, exc)
                if isinstance(exc, SlackCallError) and exc.code in UNSUPPORTED:
                    self._refused(exc)
                self._broken.add(thread)

    async def _start(self, thread: ThreadKey, chunk: dict[str, Any]) -> None:
        params: dict[str, Any] = {"channel": thread.chat, "thread_ts": thread.thread, "task_display_mode": self._mode}
        if not thread.chat.startswith("D"):
            recipient = await self._recipient(thread)
            if recipient:
                params["recipient_user_id"], params["recipient_team_id"] = recipient
        chunks = [chunk]
        if self._mode == "plan":
            chunks.insert(0, {"type": "plan_update", "title": "Working on it"})
        response = await self._api("chat_startStream", pace=thread.chat, chunks=chunks, **params)
        self._open[thread] = str(response["ts"])

    def take(self, thread: ThreadKey) -> str:
        """The open card stream of the thread, handed to the reply that continues it."""
        return self._open.pop(thread, "")

    async def close(self, thread: ThreadKey) -> None:
        """The turn ended: a card stream no reply took is stopped where it is."""
        self._broken.discard(thread)
        self._locks.pop(thread, None)
        ts = self._open.pop(thread, "")
        if not ts:
            return
        try:
            await self._api("chat_stopStream", channel=thread.chat, ts=ts)
        except ChannelError as exc:
            log.info("slack: could not stop the task cards in %s: %s", thread, exc)
