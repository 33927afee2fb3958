"""Whose memory a turn reads and writes.

- A direct message (`memory.scope: person`): its person's memory, read and written.
- A group (or any chat with `scope: chat`): the chat's own memory; with `scope: person`, also
  the speaker's own memory when they allowed it (`/memory share on`), read only and only in
  the turns they asked for. Another member's memory is never read in a group.
- A scheduled run: its job's scope only (the chat or person a job made by the agent was made
  for, else the job's own memory).
- A sub-agent: none (its parent reads and writes).

Owners are strings: "person:<channel>:<user>", "chat:<channel>:<chat>", "job:<name>".
"""

from __future__ import annotations

from typing import Any

from gateway.config import MemoryConfig
from gateway.events import ThreadKey
from gateway.store.records import SessionRecord
from gateway.tools.registry import MemoryScope


def person_owner(channel: str, user: str) -> str:
    return f"person:{channel}:{user}"


def chat_owner(thread: ThreadKey) -> str:
    """A chat's memory, shared by its topics and threads."""
    return f"chat:{thread.channel}:{thread.chat}"


def job_owner(name: str) -> str:
    return f"job:{name}"


def owner_label(owner: str) -> str:
    """How the chat and the console name an owner."""
    kind, _, rest = owner.partition(":")
    return {"person": f"person {rest}", "chat": f"chat {rest}", "job": f"job {rest}"}.get(kind, owner)


def message_owner(config: MemoryConfig, thread: ThreadKey, sender: str, private: bool) -> str:
    """Whose memory a message in `thread` from `sender` writes (and `/memory` shows)."""
    if config.scope == "person" and private and sender:
        return person_owner(thread.channel, sender)
    return chat_owner(thread)


async def turn_scope(store: Any, config: MemoryConfig, session: SessionRecord, request: Any) -> MemoryScope | None:
    """The scope of a turn (`request`: its gateway.agent.messages.TurnRequest); None: no memory."""
    if not config.enabled or request.child is not None:
        return None
    if session.schedule_id is not None:
        schedule = await store.schedules.get(session.schedule_id)
        name = schedule.name if schedule is not None else str(session.schedule_id)
        owner = (schedule.memory_owner if schedule is not None else None) or job_owner(name)
        return MemoryScope(owner, (owner,))
    if not session.interactive:
        return None
    thread: ThreadKey = request.thread
    private = bool(request.private or session.private)
    asker = str(request.requested_by or "")
    owner = message_owner(config, thread, asker, private)
    reads = [owner]
    if config.scope == "person" and not private and asker:
        speaker = person_owner(thread.channel, asker)
        if await store.memory.shared(speaker):
            reads.append(speaker)
    return MemoryScope(owner, tuple(reads))
