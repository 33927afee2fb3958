"""Approval and question prompts, human bypasses, and their compare-and-set decisions."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Sequence

from sqlalchemy import insert, or_, select, update

from gateway.store.base import Repo, to_record, utcnow
from gateway.store.inbox import InboxRepo, NewItem
from gateway.store.records import BypassRecord, PromptRecord
from gateway.store.tables import bypasses, prompts

DecideOutcome = Literal["decided", "duplicate", "unknown", "not_pending", "expired"]


@dataclass(frozen=True)
class Decision:
    outcome: DecideOutcome
    prompt: PromptRecord | None


class PromptRepo(Repo):
    async def create(
        self,
        *,
        kind: str,
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
        async with self.db.write() as conn:
            superseded: list[PromptRecord] = []
            if supersede_questions:
                rows = (
                    await conn.execute(
                        update(prompts)
                        .where(prompts.c.thread_key == thread_key, prompts.c.kind == "question", prompts.c.status == "pending")
                        .values(status="superseded", decided_at=now)
                        .returning(*prompts.c)
                    )
                ).all()
                superseded = [to_record(PromptRecord, r) for r in rows]
            prompt_id = (
                await conn.execute(
                    insert(prompts)
                    .values(
                        token=token, kind=kind, session_id=session_id, thread_key=thread_key, run_id=run_id,
                        tool_call_id=tool_call_id, status="pending", payload=payload, requested_by=requested_by,
                        message_ids=[], created_at=now, expires_at=expires_at,
                    )
                    .returning(prompts.c.id)
                )
            ).scalar_one()
            row = (await conn.execute(select(prompts).where(prompts.c.id == prompt_id))).first()
        return to_record(PromptRecord, row), superseded

    async def get(self, prompt_id: int) -> PromptRecord | None:
        async with self.db.read() as conn:
            row = (await conn.execute(select(prompts).where(prompts.c.id == prompt_id))).first()
        return to_record(PromptRecord, row) if row else None

    async def by_token(self, token: str) -> PromptRecord | None:
        async with self.db.read() as conn:
            row = (await conn.execute(select(prompts).where(prompts.c.token == token))).first()
        return to_record(PromptRecord, row) if row else None

    async def for_tool_call(self, tool_call_id: int) -> PromptRecord | None:
        """The latest prompt about a tool call (approval or ask_user question)."""
        async with self.db.read() as conn:
            row = (
                await conn.execute(select(prompts).where(prompts.c.tool_call_id == tool_call_id).order_by(prompts.c.id.desc()).limit(1))
            ).first()
        return to_record(PromptRecord, row) if row else None

    async def set_message_ids(self, prompt_id: int, message_ids: Sequence[str]) -> None:
        async with self.db.write() as conn:
            await conn.execute(update(prompts).where(prompts.c.id == prompt_id).values(message_ids=list(message_ids)))

    async def pending(self, *, thread_key: str | None = None, session_id: int | None = None, kind: str | None = None) -> list[PromptRecord]:
        query = select(prompts).where(prompts.c.status == "pending").order_by(prompts.c.id)
        if thread_key is not None:
            query = query.where(prompts.c.thread_key == thread_key)
        if session_id is not None:
            query = query.where(prompts.c.session_id == session_id)
        if kind is not None:
            query = query.where(prompts.c.kind == kind)
        async with self.db.read() as conn:
            rows = (await conn.execute(query)).all()
        return [to_record(PromptRecord, r) for r in rows]

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
        resume: NewItem | None = None,
        now: datetime | None = None,
        enforce_expiry: bool = True,
        reason_from_held: bool = False,
    ) -> Decision:
        """Compare-and-set pending -> `status`, in one transaction with the inbound event (dedupe)
        and the resume item that continues the turn. Only one decision ever wins."""
        now = now or utcnow()
        async with self.db.write() as conn:
            if event is not None and not await InboxRepo.add_in(conn, event):
                return Decision("duplicate", None)
            row = (await conn.execute(select(prompts).where(prompts.c.id == prompt_id))).first()
            if row is None:
                return Decision("unknown", None)
            if row.status != "pending":
                return Decision("not_pending", to_record(PromptRecord, row))
            expired = enforce_expiry and row.expires_at is not None and row.expires_at <= now
            if expired:
                return Decision("expired", to_record(PromptRecord, row))
            changed = await conn.execute(
                update(prompts)
                .where(prompts.c.id == prompt_id, prompts.c.status == "pending")
                .values(status=status, decision=decision, decided_by=decided_by, decided_by_name=decided_by_name, answer=answer, decided_at=now)
            )
            if changed.rowcount != 1:
                return Decision("not_pending", to_record(PromptRecord, row))
            # Messages held while the prompt was pending go back to the queue; on a denial the
            # latest of them may be the reason the person typed.
            reason = await InboxRepo.release_held_in(conn, row.thread_key, take_reason=reason_from_held)
            if reason:
                await conn.execute(update(prompts).where(prompts.c.id == prompt_id).values(answer=reason))
            if resume is not None:
                await InboxRepo.add_in(conn, resume)
            decided = (await conn.execute(select(prompts).where(prompts.c.id == prompt_id))).first()
        return Decision("decided", to_record(PromptRecord, decided))

    async def due(self, now: datetime | None = None) -> list[PromptRecord]:
        now = now or utcnow()
        async with self.db.read() as conn:
            rows = (await conn.execute(select(prompts).where(prompts.c.status == "pending", prompts.c.expires_at <= now))).all()
        return [to_record(PromptRecord, r) for r in rows]

    async def cancel(self, prompt_ids: Sequence[int], *, status: str = "canceled") -> list[PromptRecord]:
        if not prompt_ids:
            return []
        async with self.db.write() as conn:
            rows = (
                await conn.execute(
                    update(prompts)
                    .where(prompts.c.id.in_(list(prompt_ids)), prompts.c.status == "pending")
                    .values(status=status, decided_at=utcnow())
                    .returning(*prompts.c)
                )
            ).all()
            for thread_key in {r.thread_key for r in rows}:  # messages held for them are queued again
                await InboxRepo.release_held_in(conn, thread_key, take_reason=False)
        return [to_record(PromptRecord, r) for r in rows]

    # ---- bypasses --------------------------------------------------------------------------
    async def add_bypass(self, *, thread_key: str, tool: str, expires_at: datetime | None, granted_by: str, prompt_id: int | None) -> None:
        async with self.db.write() as conn:
            await conn.execute(
                insert(bypasses).values(thread_key=thread_key, tool=tool, expires_at=expires_at, granted_by=granted_by, prompt_id=prompt_id, created_at=utcnow())
            )

    async def active_bypasses(self, thread_key: str, now: datetime | None = None) -> list[BypassRecord]:
        now = now or utcnow()
        async with self.db.read() as conn:
            rows = (
                await conn.execute(
                    select(bypasses).where(bypasses.c.thread_key == thread_key, or_(bypasses.c.expires_at.is_(None), bypasses.c.expires_at > now))
                )
            ).all()
        return [to_record(BypassRecord, r) for r in rows]
