"""Erasing a person (`gateway memory erase-person <channel>:<id>`): what the database holds about
them, removed or redacted, with a count per kind.

- memory: their own memory and the entries they saved in chats' memories (forgotten as
  `/memory forget` does: copies in the kept history too), and their sharing choice;
- their direct messages: the sessions (history, tool calls, folded history, runs and their
  events, prompts, sub-agents' tasks) and their threads' inbox and outbox rows and standing
  approvals, deleted;
- where they spoke with others (groups, channels): their messages' texts in the history
  replaced by "[erased]" (name, id and images dropped), the same texts taken out of that
  conversation's folded history, their inbox items deleted (a message still waiting to be
  answered is left and counted), their prompts' arguments deleted, their name on prompts they
  decided dropped;
- access: their grants, pairing requests, spend counters and the standing approvals they gave
  or hold;
- the audit trail: the rows naming them or about their direct messages keep what happened and
  when, not who or with what ("erased", arguments and detail dropped).

What others said about them, the agent's replies in shared chats, summaries that paraphrase
them and jobs they made are left (docs/memory.md, "Erasing a person"). Files are the caller's
(`Erased.files`: the session directories and attachments to delete).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, delete, false, or_, select, update
from sqlalchemy.engine import Connection

from gateway.store.base import Repo
from gateway.store.redaction import Places, Scrubber, with_children
from gateway.store.tables import (
    access_grants,
    access_requests,
    audit,
    budget_counters,
    bypasses,
    claim_attempts,
    compactions,
    delegations,
    inbox,
    memories,
    memory_sharing,
    messages,
    outbox,
    prompts,
    runs,
    sessions,
    threads,
)

ERASED = "[erased]"
FINISHED = ("done", "dropped", "context", "note")


@dataclass
class Erased:
    """What an erasure removed (counts per kind), what it left and why, and the files to delete."""

    counts: Counter[str] = field(default_factory=Counter)
    left: Counter[str] = field(default_factory=Counter)
    dm_sessions: list[int] = field(default_factory=list)  # their directories go too
    attachments: list[tuple[int, str]] = field(default_factory=list)  # (session id, path in its directory)


class ErasureRepo(Repo):
    async def erase_person(self, channel: str, user: str, memory: Any) -> Erased:
        """Erase `user` of `channel`; `memory` is the store's MemoryRepo (forgetting with copies)."""
        person = f"{channel}:{user}"
        erased = Erased()
        erased.counts["memory entries"] += await memory.clear(f"person:{channel}:{user}")
        for owner, ids in (await self.db.read(lambda conn: _authored(conn, person))).items():
            erased.counts["memory entries"] += len(await memory.forget(owner, ids))
        await self.db.write(lambda conn: _in(conn, erased, "memory sharing", delete(memory_sharing).where(
            memory_sharing.c.owner == f"person:{channel}:{user}")))
        places = await self.db.read(lambda conn: _direct_messages(conn, channel, user))
        erased.dm_sessions = list(places.sessions)
        await self.db.write(lambda conn: _erase_direct_messages(conn, places, erased))
        await self.db.write(lambda conn: _redact_shared(conn, channel, user, erased))
        await self.db.write(lambda conn: _erase_access(conn, channel, user, erased))
        await self.db.write(lambda conn: _redact_audit(conn, person, places.threads, erased))
        await self.db.flush_erased()
        return erased


def _in(conn: Connection, erased: Erased, kind: str, statement: Any) -> None:
    erased.counts[kind] += int(conn.execute(statement).rowcount or 0)


def _authored(conn: Connection, person: str) -> dict[str, list[int]]:
    """The entries `person` saved in memories not their own, by owner."""
    rows = conn.execute(select(memories.c.owner, memories.c.id).where(memories.c.created_by == person)).all()
    by_owner: dict[str, list[int]] = {}
    for owner, memory_id in rows:
        by_owner.setdefault(str(owner), []).append(int(memory_id))
    return by_owner


def _channel_threads(channel: str) -> Any:
    return sessions.c.thread_key.like(f"{channel}:%")


def _direct_messages(conn: Connection, channel: str, user: str) -> Places:
    theirs = and_(_channel_threads(channel), sessions.c.private.is_(True), sessions.c.started_by == user)
    return with_children(conn, conn.execute(select(sessions.c.id, sessions.c.thread_key).where(theirs)).all())


def _erase_direct_messages(conn: Connection, places: Places, erased: Erased) -> None:
    ids, keys = list(places.sessions), list(places.threads)
    if not ids and not keys:
        return
    counted = select(messages.c.id).where(messages.c.session_id.in_(ids))
    erased.counts["direct-message history rows"] += len(conn.execute(counted).all())
    _in(conn, erased, "runs", delete(runs).where(runs.c.session_id.in_(ids)))  # their events go with them
    _in(conn, erased, "prompts", delete(prompts).where(prompts.c.session_id.in_(ids)))
    conn.execute(delete(delegations).where(
        or_(delegations.c.parent_session_id.in_(ids), delegations.c.child_session_id.in_(ids))))
    conn.execute(delete(threads).where(threads.c.key.in_(keys)))
    _in(conn, erased, "direct-message sessions", delete(sessions).where(sessions.c.id.in_(ids)))  # with their rows
    _in(conn, erased, "inbox items", delete(inbox).where(inbox.c.thread_key.in_(keys), inbox.c.status.in_(FINISHED)))
    waiting = select(inbox.c.id).where(inbox.c.thread_key.in_(keys), inbox.c.status.notin_(FINISHED))
    erased.left["messages still waiting to be answered"] += len(conn.execute(waiting).all())
    _in(conn, erased, "outbox rows", delete(outbox).where(outbox.c.thread_key.in_(keys), outbox.c.status != "pending"))
    _in(conn, erased, "standing approvals", delete(bypasses).where(bypasses.c.thread_key.in_(keys)))


def _redact_shared(conn: Connection, channel: str, user: str, erased: Erased) -> None:
    """Their words where they spoke with others."""
    shared = select(sessions.c.id).where(_channel_threads(channel))
    said = conn.execute(select(messages.c.id, messages.c.session_id, messages.c.content).where(
        messages.c.sender_id == user, messages.c.role == "user", messages.c.session_id.in_(shared))).all()
    texts: dict[int, list[str]] = {}
    for _, session_id, content in said:
        texts.setdefault(int(session_id), []).append(str(content or ""))
    if said:
        conn.execute(update(messages).where(messages.c.id.in_([r[0] for r in said])).values(
            content=ERASED, sender_id=None, sender_name=None, images=None))
        erased.counts["messages redacted in shared chats"] += len(said)
    for session_id, contents in texts.items():
        _scrub_folded(conn, session_id, Scrubber([c for c in contents if len(c.strip()) >= 8], ERASED))
    conn.execute(update(sessions).where(sessions.c.id.in_(shared), sessions.c.started_by == user).values(started_by=""))
    _erase_their_items(conn, channel, user, erased)
    mine = and_(prompts.c.thread_key.like(channel + ":%"), prompts.c.status != "pending")
    _in(conn, erased, "prompts", delete(prompts).where(mine, prompts.c.requested_by == user))
    conn.execute(update(prompts).where(mine, prompts.c.decided_by == user).values(decided_by=ERASED,
                                                                                  decided_by_name=None))


def _scrub_folded(conn: Connection, session_id: int, scrubber: Scrubber) -> None:
    rows = conn.execute(select(compactions.c.id, compactions.c.summary, compactions.c.folded_text).where(
        compactions.c.session_id == session_id)).all()
    for row_id, summary, folded in rows:
        cleaned = (scrubber.text(summary), scrubber.text(folded))
        if cleaned != (summary, folded):
            conn.execute(update(compactions).where(compactions.c.id == row_id).values(
                summary=cleaned[0], folded_text=cleaned[1]))


def _erase_their_items(conn: Connection, channel: str, user: str, erased: Erased) -> None:
    """Their inbox items in shared chats (messages, kept chatter, edits): the finished ones
    deleted (their attachments' files listed for deleting), the waiting ones counted."""
    rows = conn.execute(select(inbox.c.id, inbox.c.status, inbox.c.session_id, inbox.c.payload).where(
        inbox.c.thread_key.like(channel + ":%"))).all()
    gone = []
    for item_id, status, session_id, payload in rows:
        sender = payload.get("sender") if isinstance(payload, dict) else None
        if not isinstance(sender, dict) or str(sender.get("id") or "") != user:
            continue
        if status not in FINISHED:
            erased.left["messages still waiting to be answered"] += 1
            continue
        gone.append(item_id)
        for attachment in payload.get("attachments") or ():
            path = ((attachment or {}).get("outcome") or {}).get("path")
            if path and session_id is not None:
                erased.attachments.append((int(session_id), str(path)))
    if gone:
        _in(conn, erased, "inbox items", delete(inbox).where(inbox.c.id.in_(gone)))


def _erase_access(conn: Connection, channel: str, user: str, erased: Erased) -> None:
    person = f"{channel}:{user}"
    subject = and_(access_grants.c.channel == channel, access_grants.c.subject == user)
    kinds = access_grants.c.kind.in_(("user", "admin"))  # a claimed admin's grant names them too
    _in(conn, erased, "access grants", delete(access_grants).where(kinds, subject))
    tried = and_(claim_attempts.c.channel == channel, claim_attempts.c.person == user)
    conn.execute(delete(claim_attempts).where(tried))  # their wrong claim codes (a lock-out), if any
    asked = and_(access_requests.c.channel == channel, access_requests.c.kind == "user",
                 access_requests.c.subject == user)
    _in(conn, erased, "pairing requests", delete(access_requests).where(asked))
    conn.execute(update(access_requests).where(
        access_requests.c.channel == channel, access_requests.c.asked_by.in_((user, person))).values(asked_by=None))
    _in(conn, erased, "spend counters", delete(budget_counters).where(
        budget_counters.c.scope == "user", budget_counters.c.subject == person))
    in_channel = bypasses.c.thread_key.like(channel + ":%")
    _in(conn, erased, "standing approvals", delete(bypasses).where(
        in_channel, or_(bypasses.c.granted_by == user, bypasses.c.person == user)))


def _redact_audit(conn: Connection, person: str, dm_threads: tuple[str, ...], erased: Erased) -> None:
    their_threads = list(dm_threads)
    about = or_(audit.c.actor == person, audit.c.decided_by == person,
                audit.c.thread_key.in_(their_threads) if their_threads else false())
    rows = conn.execute(select(audit.c.id, audit.c.actor, audit.c.decided_by, audit.c.thread_key).where(about)).all()
    for row_id, actor, decided_by, thread_key in rows:
        conn.execute(update(audit).where(audit.c.id == row_id).values(
            actor=ERASED if actor == person else actor,
            decided_by=ERASED if decided_by == person else decided_by,
            thread_key=ERASED if thread_key in their_threads else thread_key,
            arguments=None, detail={"erased": True},
        ))
    erased.counts["audit rows redacted"] += len(rows)
