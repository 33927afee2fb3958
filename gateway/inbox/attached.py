"""Messages with files, made ready for their turn: album parts gathered into one message and
every attachment settled (gateway/attachments) before the user row is written."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from gateway.attachments import AttachmentPreparer
from gateway.config import AttachmentsConfig
from gateway.events import ThreadKey, utcnow
from gateway.inbox.surroundings import with_context
from gateway.store import Fence, InboxItem, Store


class MessageReadiness:
    def __init__(self, store: Store, config: AttachmentsConfig, preparer: AttachmentPreparer | None):
        self.store = store
        self.config = config
        self.preparer = preparer

    async def ready(
        self, thread: ThreadKey, items: list[InboxItem], session_id: int
    ) -> list[tuple[int, dict[str, Any]]]:
        """(item id, payload) per message to append: album parts merged into their first part
        once no new part arrived for `album_wait_s`, attachments settled, what it replies to or
        edits put into words (gateway/inbox/surroundings.py)."""
        messages = await self._albums(thread, items)
        ready = []
        for item_id, payload in messages:
            if payload.get("attachments") and self.preparer is not None:
                payload = (await self.preparer.prepare(item_id, payload, thread, session_id)).payload
            ready.append((item_id, with_context(payload)))
        return ready

    async def addressed_part(self, thread: ThreadKey, part: InboxItem, fence: Fence) -> InboxItem | None:
        """For an album part that does not address the agent (a group album whose caption,
        with the mention, is on another part): once the album is whole (no new part for
        `album_wait_s`), its addressed part, which takes the others along; None when no part
        is addressed (the parts are then dropped, never a turn of their own)."""
        group = part.payload.get("group")
        while True:
            pending = [i for i in await self.store.inbox.pending(str(thread), limit=200) if i.kind == "message"]
            album = [i for i in pending if i.payload.get("group") == group]
            addressed = next((i for i in album if not i.payload.get("album_part")), None)
            if addressed is not None:
                return addressed
            newest = max((_received(i) for i in album), default=None)
            wait = self.config.album_wait_s - (utcnow() - newest).total_seconds() if newest else 0.0
            if wait <= 0:
                await self.store.inbox.finish([i.id for i in album] or [part.id], status="dropped", fence=fence)
                return None
            await asyncio.sleep(wait)

    async def _albums(self, thread: ThreadKey, items: list[InboxItem]) -> list[tuple[int, dict[str, Any]]]:
        groups = {str(i.payload.get("group")) for i in items if i.payload.get("group")}
        if not groups:
            return [(i.id, i.payload) for i in items]
        while True:  # parts of an album arrive as separate updates, close together
            pending = [i for i in await self.store.inbox.pending(str(thread), limit=200) if i.kind == "message"]
            newest = max((_received(i) for i in pending if i.payload.get("group") in groups), default=None)
            wait = self.config.album_wait_s - (utcnow() - newest).total_seconds() if newest else 0.0
            if wait <= 0:
                break
            await asyncio.sleep(wait)
        wanted = {i.id for i in items}
        chosen = [i for i in pending if i.id in wanted or (i.payload.get("group") in groups)]
        return _merged(chosen)


def _received(item: InboxItem) -> datetime:
    try:
        return datetime.fromisoformat(str(item.payload.get("received_at")))
    except ValueError:
        return item.created_at


def _merged(items: list[InboxItem]) -> list[tuple[int, dict[str, Any]]]:
    """Each album becomes its first part, carrying every part's caption and files (in order)
    and the ids of the other parts (`merged_items`, marked done with it). A first part merged
    before a restart keeps its recorded merge, with the outcomes already settled."""
    out: list[tuple[int, dict[str, Any]]] = []
    firsts: dict[str, dict[str, Any]] = {}
    taken: set[int] = set()
    for item in items:
        group = item.payload.get("group")
        if group and item.payload.get("merged_items"):
            taken.update(int(i) for i in item.payload["merged_items"])
    for item in items:
        group = item.payload.get("group")
        if item.id in taken:
            continue
        if not group:
            out.append((item.id, item.payload))
            continue
        first = firsts.get(group)
        if first is None:
            payload = {**item.payload, "attachments": list(item.payload.get("attachments") or ())}
            payload.pop("album_part", None)  # merged only from its album's addressed part
            payload.setdefault("merged_items", [])
            firsts[group] = payload
            out.append((item.id, payload))
            continue
        if item.payload.get("text"):
            first["text"] = "\n".join(t for t in (first.get("text"), item.payload["text"]) if t)
        first["attachments"].extend(item.payload.get("attachments") or ())
        first["merged_items"].append(item.id)
    return out
