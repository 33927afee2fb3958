"""Intake of what revises the conversation rather than adding a turn: edits, deletions,
reactions on the agent's replies, and group chatter kept as context (gateway/store/conversation.py
applies each in the transaction that records it)."""

from __future__ import annotations

import logging

from gateway.events import InboundMessage, MessageDeleted, Reaction, SubmitResult
from gateway.inbox.commands import parse_command
from gateway.serving import metrics
from gateway.store import NewItem, Store, notify
from gateway.store.items import message_item

log = logging.getLogger("gateway.inbox.inbox")


def revises(event: object) -> bool:
    """Whether `event` is for `Revisions` rather than an ordinary message or press."""
    if isinstance(event, MessageDeleted | Reaction):
        return True
    return isinstance(event, InboundMessage) and bool(event.edit_of or event.context_keep)


class Revisions:
    def __init__(self, store: Store):
        self.store = store

    async def submit(self, event: InboundMessage | MessageDeleted | Reaction) -> SubmitResult:
        if isinstance(event, Reaction):
            return await self._react(event)
        if isinstance(event, MessageDeleted):
            return await self._delete(event)
        if event.edit_of:
            return await self._edit(event)
        return await self._keep(event)

    async def _edit(self, event: InboundMessage) -> SubmitResult:
        thread = event.thread
        is_command = parse_command(event.text) is not None
        item = message_item(event, "edit", message_id=event.edit_of)
        outcome = await self.store.conversation.edit(
            item, thread.channel, thread.chat, event.edit_of, is_command=is_command, keep=event.context_keep
        )
        log.info("%s: edit of message %s: %s", thread, event.edit_of, outcome)
        if outcome in ("new", "follow-up"):
            await notify.publish(self.store.db, {str(thread)})
        return self._counted(event, "edit", duplicate=outcome == "duplicate")

    async def _delete(self, event: MessageDeleted) -> SubmitResult:
        thread = event.thread
        item = message_item_for(event.event_id, str(thread), "delete", {"message_id": event.message_id})
        outcome = await self.store.conversation.delete(item, thread.channel, thread.chat, event.message_id)
        log.info("%s: message %s deleted: %s", thread, event.message_id, outcome)
        return self._counted(event, "delete", duplicate=outcome == "duplicate")

    async def _react(self, event: Reaction) -> SubmitResult:
        thread = event.thread
        feedback = {
            "added": list(event.added),
            "removed": list(event.removed),
            "by": event.sender.id,
            "by_name": event.sender.name,
            "message_id": event.message_id,
        }
        item = message_item_for(event.event_id, str(thread), "reaction", feedback)
        found = await self.store.conversation.react(item, thread.channel, thread.chat, event.message_id, feedback)
        if found.run_id is not None and not found.duplicate:
            for change, values in (("added", event.added), ("removed", event.removed)):
                for value in values:
                    metrics.FEEDBACK.labels(thread.channel, value, change).inc()
            log.info("%s: feedback %s on run %s", thread, feedback, found.run_id)
        elif found.run_id is None and not found.duplicate:
            log.debug("%s: a reaction on message %s, not one of the agent's replies", thread, event.message_id)
        return self._counted(event, "reaction", duplicate=found.duplicate)

    async def _keep(self, event: InboundMessage) -> SubmitResult:
        item = message_item(event, "ambient", status="context")
        new = await self.store.conversation.keep_context(item, event.context_keep)
        return self._counted(event, "ambient", duplicate=not new)

    @staticmethod
    def _counted(event: InboundMessage | MessageDeleted | Reaction, kind: str, *, duplicate: bool) -> SubmitResult:
        if duplicate:
            metrics.DUPLICATES.labels(event.thread.channel).inc()
        else:
            metrics.INBOUND.labels(event.thread.channel, kind).inc()
        return SubmitResult(event.event_id, duplicate=duplicate)


def message_item_for(event_id: str, thread_key: str, kind: str, payload: dict) -> NewItem:
    """A record only (a deletion, a reaction): done when written, unique on its event id."""
    return NewItem(event_id, thread_key, kind, payload, status="done")
