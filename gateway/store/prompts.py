"""Approval and question prompts, human bypasses, and their compare-and-set decisions."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import bindparam, insert, or_, select, update
from sqlalchemy.engine import Connection

from gateway.events import utcnow
from gateway.store.base import Repo, to_record
from gateway.store.inbox import InboxRepo, NewItem
from gateway.store.records import BypassRecord, PromptKind, PromptRecord
from gateway.store.tables import bypasses, prompts

DecideOutcome = Literal["decided", "duplicate", "unknown", "not_pending", "expired"]

# Statements of every tool call and inbound message, built once (building one costs more than
# running it).
_PROMPT_BY_ID = select(prompts).where(prompts.c.id == bindparam("id"))
_LATEST_FOR_TOOL_CALL = (
    select(prompts).where(prompts.c.tool_call_id == bindparam("tool_call_id")).order_by(prompts.c.id.desc()).limit(1)
)
_PENDING_IN_THREAD = (
    select(prompts)
    .where(prompts.c.status == "pending", prompts.c.thread_key == bindparam("thread_key"))
    .order_by(prompts.c.id)
)
_ACTIVE_BYPASSES = select(bypasses).where(
    bypasses.c.thread_key == bindparam("thread_key"),
    or_(bypasses.c.expires_at.is_(None), bypasses.c.expires_at > bindparam("now")),
)


@dataclass(frozen=True)
class DecideResult:
    outcome: DecideOutcome
    prompt: PromptRecord | None


class PromptRepo(Repo):
    async def create(
        self,
        *,
        kind: PromptKind,
        session_id: int,
        thread_key: str,
        payload: dict[str, Any],
        requested_by: str,
        expires_at: datetime | None,
        run_id: int | None = None,
        tool_call_id: int | None = None,
        supersede_questions: bool = False,
    ) -> tuple[PromptRecord, list[PromptRecord]]:
        """Save a pending prompt; with `supersede_questions`, older pending questions of the
        thread become `superseded` in the same transaction (returned so their buttons can be closed)."""
        token = secrets.token_urlsafe(16)  # 22 chars, 128 bits: unguessable, fits callback_data
        now = utcnow()

        def work(conn: Connection) -> tuple[PromptRecord, list[PromptRecord]]:
            superseded: list[PromptRecord] = []
            if supersede_questions:
                rows = conn.execute(
                    update(prompts)
                    .where(
                        prompts.c.thread_key == thread_key, prompts.c.kind == "question", prompts.c.status == "pending"
                    )
                    .values(status="superseded", decided_at=now)
                    .returning(*prompts.c)
                ).all()
                superseded = [to_record(PromptRecord, r) for r in rows]
            prompt_id = conn.execute(
                insert(prompts)
                .values(
                    token=token, kind=kind, session_id=session_id, thread_key=thread_key, run_id=run_id,
                    tool_call_id=tool_call_id, status="pending", payload=payload, requested_by=requested_by,
                    message_ids=[], created_at=now, expires_at=expires_at,
                )
                .returning(prompts.c.id)
            ).scalar_one()
            row = conn.execute(_PROMPT_BY_ID, {"id": prompt_id}).first()
            return to_record(PromptRecord, row), superseded

        return await self.db.write(work)

    async def get(self, prompt_id: int) -> PromptRecord | None:
        return await self.db.read(lambda conn: _one(conn.execute(_PROMPT_BY_ID, {"id": prompt_id}).first()))

    async def by_token(self, token: str) -> PromptRecord | None:
        return await self.db.read(
            lambda conn: _one(conn.execute(select(prompts).where(prompts.c.token == token)).first())
        )

    async def for_tool_call(self, tool_call_id: int) -> PromptRecord | None:
        """The latest prompt about a tool call (approval or ask_user question)."""
        return await self.db.read(
            lambda conn: _one(conn.execute(_LATEST_FOR_TOOL_CALL, {"tool_call_id": tool_call_id}).first())
        )

    @staticmethod
    def pending_in_thread_in(conn: Connection, thread_key: str) -> list[PromptRecord]:
        return _all(conn.execute(_PENDING_IN_THREAD, {"thread_key": thread_key}))

    async def move_to_run(self, prompt_id: int, run_id: int) -> None:
        """A prompt asked by a run cut short now waits for the run that continues it: a
        decision resumes the run that is parked on it."""
        statement = update(prompts).where(prompts.c.id == prompt_id).values(run_id=run_id)
        await self.db.write(lambda conn: conn.execute(statement))

    async def extend(self, prompt_id: int, expires_at: datetime) -> bool:
        """Move a pending prompt's expiry (a question a running call waits for stays alive while
        the call does); False when it is no longer pending."""
        statement = (
            update(prompts)
            .where(prompts.c.id == prompt_id, prompts.c.status == "pending")
            .values(expires_at=expires_at)
        )
        return bool(await self.db.write(lambda conn: conn.execute(statement).rowcount))

    async def set_message_ids(self, prompt_id: int, message_ids: Sequence[str]) -> None:
        statement = update(prompts).where(prompts.c.id == prompt_id).values(message_ids=list(message_ids))
        await self.db.write(lambda conn: conn.execute(statement))

    async def set_copies(self, prompt_id: int, copies: list[list[Any]]) -> None:
        """Where copies of the prompt were sent ([[thread key, [message ids], receiver], ...]: the
        deciders' DMs, their own cards in a group), kept in its payload so closing it closes them
        too. Rows written before the receiver have two fields."""

        def work(conn: Connection) -> None:
            row = conn.execute(select(prompts.c.payload).where(prompts.c.id == prompt_id)).first()
            if row is not None:
                payload = {**(row.payload or {}), "copies": copies}
                conn.execute(update(prompts).where(prompts.c.id == prompt_id).values(payload=payload))

        await self.db.write(work)

    async def set_copy(self, prompt_id: int, thread_key: str, message_ids: Sequence[str], receiver: str = "") -> None:
        """One copy of the prompt delivered later (by the sweeper): its place among `copies`.
        `receiver`: the one person who sees it in `thread_key` (a decider's card in a group)."""

        def work(conn: Connection) -> None:
            row = conn.execute(select(prompts.c.payload).where(prompts.c.id == prompt_id)).first()
            if row is not None:
                copies = (row.payload or {}).get("copies", [])
                others = [c for c in copies if (c[0], c[2] if len(c) > 2 else "") != (thread_key, receiver)]
                payload = {**(row.payload or {}), "copies": [*others, [thread_key, list(message_ids), receiver]]}
                conn.execute(update(prompts).where(prompts.c.id == prompt_id).values(payload=payload))

        await self.db.write(work)

    async def pending(
        self, *, thread_key: str | None = None, session_id: int | None = None, kind: str | None = None
    ) -> list[PromptRecord]:
        if thread_key is not None and session_id is None and kind is None:  # every inbound message asks this
            return await self.db.read(lambda conn: self.pending_in_thread_in(conn, thread_key))
        query = select(prompts).where(prompts.c.status == "pending").order_by(prompts.c.id)
        if thread_key is not None:
            query = query.where(prompts.c.thread_key == thread_key)
        if session_id is not None:
            query = query.where(prompts.c.session_id == session_id)
        if kind is not None:
            query = query.where(prompts.c.kind == kind)
        return await self.db.read(lambda conn: _all(conn.execute(query)))

    async def decide(
        self,
        prompt_id: int,
        *,
        status: str,
        decision: str,
        decided_by: str,
        decided_by_name: str = "",
        answer: str | None = None,
        event: NewItem | None = None,
        resume: Callable[[PromptRecord], NewItem] | None = None,
        now: datetime | None = None,
        enforce_expiry: bool = True,
        reason_from_held: bool = False,
    ) -> DecideResult:
        """Compare-and-set pending -> `status`, in one transaction with the inbound event (dedupe)
        and the item that continues the turn (`resume`, built from the decided prompt: a resume
        item carries the verdict). Only one decision ever wins."""
        now = now or utcnow()

        def work(conn: Connection) -> DecideResult:
            if event is not None and not InboxRepo.add_in(conn, event):
                return DecideResult("duplicate", None)
            row = conn.execute(_PROMPT_BY_ID, {"id": prompt_id}).first()
            if row is None:
                return DecideResult("unknown", None)
            if row.status != "pending":
                return DecideResult("not_pending", to_record(PromptRecord, row))
            expired = enforce_expiry and row.expires_at is not None and row.expires_at <= now
            if expired:
                return DecideResult("expired", to_record(PromptRecord, row))
            changed = conn.execute(
                update(prompts)
                .where(prompts.c.id == prompt_id, prompts.c.status == "pending")
                .values(
                    status=status,
                    decision=decision,
                    decided_by=decided_by,
                    decided_by_name=decided_by_name,
                    answer=answer,
                    decided_at=now,
                )
            )
            if changed.rowcount != 1:
                return DecideResult("not_pending", to_record(PromptRecord, row))
            # Messages held while the prompt was pending go back to the queue; on a denial the
            # latest of them may be the reason the person typed.
            reason = InboxRepo.release_held_in(
                conn, row.thread_key, take_reason=reason_from_held, reason_from=decided_by
            )
            if reason:
                conn.execute(update(prompts).where(prompts.c.id == prompt_id).values(answer=reason))
            decided = to_record(PromptRecord, conn.execute(_PROMPT_BY_ID, {"id": prompt_id}).first())
            if resume is not None:
                InboxRepo.add_in(conn, resume(decided))
            return DecideResult("decided", decided)

        return await self.db.write(work)

    async def due(self, now: datetime | None = None) -> list[PromptRecord]:
        query = select(prompts).where(prompts.c.status == "pending", prompts.c.expires_at <= (now or utcnow()))
        return await self.db.read(lambda conn: _all(conn.execute(query)))

    async def cancel(self, prompt_ids: Sequence[int], *, status: str = "canceled") -> list[PromptRecord]:
        if not prompt_ids:
            return []

        def work(conn: Connection) -> list[PromptRecord]:
            rows = conn.execute(
                update(prompts)
                .where(prompts.c.id.in_(list(prompt_ids)), prompts.c.status == "pending")
                .values(status=status, decided_at=utcnow())
                .returning(*prompts.c)
            ).all()
            for thread_key in {r.thread_key for r in rows}:  # messages held for them are queued again
                InboxRepo.release_held_in(conn, thread_key, take_reason=False)
            return [to_record(PromptRecord, r) for r in rows]

        return await self.db.write(work)

    # ---- bypasses --------------------------------------------------------------------------
    async def add_bypass(
        self,
        *,
        thread_key: str,
        tool: str,
        expires_at: datetime | None,
        granted_by: str,
        prompt_id: int | None,
        person: str | None = None,
    ) -> None:
        """`person`: whose later requests it covers (the one whose request was approved)."""
        statement = insert(bypasses).values(
            thread_key=thread_key,
            tool=tool,
            expires_at=expires_at,
            granted_by=granted_by,
            person=person if person is not None else granted_by,
            prompt_id=prompt_id,
            created_at=utcnow(),
        )
        await self.db.write(lambda conn: conn.execute(statement))

    async def active_bypasses(self, thread_key: str, now: datetime | None = None) -> list[BypassRecord]:
        params = {"thread_key": thread_key, "now": now or utcnow()}
        return await self.db.read(
            lambda conn: [to_record(BypassRecord, r) for r in conn.execute(_ACTIVE_BYPASSES, params)]
        )


def _one(row: Any) -> PromptRecord | None:
    return to_record(PromptRecord, row) if row else None


def _all(result: Any) -> list[PromptRecord]:
    return [to_record(PromptRecord, r) for r in result]
