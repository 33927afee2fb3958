"""Threads, sessions, messages and tool calls."""

from __future__ import annotations

import builtins  # the repositories have a `list` method, which hides the type in their signatures
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.engine import Connection

from gateway.events import ThreadKey, utcnow
from gateway.store.audit import AuditEntry, AuditRepo
from gateway.store.base import Fence, Repo, check_fence, to_record
from gateway.store.records import (
    MessageRecord,
    NewToolCall,
    SessionKind,
    SessionRecord,
    ToolCallRecord,
)
from gateway.store.tables import messages, sessions, threads, tool_calls

# Statements of every turn, built once (building one costs more than running it).
_SESSION_BY_ID = select(sessions).where(sessions.c.id == bindparam("id"))
_NEXT_SEQ = (
    update(sessions)
    .where(sessions.c.id == bindparam("session_id"))  # not "id": update() reserves column names
    .values(next_seq=sessions.c.next_seq + 1)
    .returning(sessions.c.next_seq - 1)
)
_INSERT_MESSAGE = insert(messages).returning(messages.c.id)
_INSERT_TOOL_CALL = insert(tool_calls).returning(tool_calls.c.id)
_CURRENT_SESSION = (
    select(sessions).join(threads, threads.c.session_id == sessions.c.id).where(threads.c.key == bindparam("key"))
)
# SET columns come with each execute (status, and result, note, finished_at when given).
_SET_TOOL_CALL = update(tool_calls).where(tool_calls.c.id == bindparam("tool_call_id"))
_NOTES = select(sessions.c.notes).where(sessions.c.id == bindparam("id"))
_OPEN_TOOL_CALLS = (
    select(tool_calls)
    .where(tool_calls.c.session_id == bindparam("session_id"), tool_calls.c.status.in_(("running", "pending")))
    .order_by(tool_calls.c.message_id, tool_calls.c.ordinal)
)


class SessionRepo(Repo):
    # ---- sessions -------------------------------------------------------------------------
    async def current(self, thread_key: str) -> SessionRecord | None:
        return await self.db.read(lambda conn: self.current_in(conn, thread_key))

    @staticmethod
    def current_in(conn: Connection, thread_key: str) -> SessionRecord | None:
        row = conn.execute(_CURRENT_SESSION, {"key": thread_key}).first()
        return to_record(SessionRecord, row) if row else None

    async def get(self, session_id: int) -> SessionRecord | None:
        def work(conn: Connection) -> SessionRecord | None:
            row = conn.execute(_SESSION_BY_ID, {"id": session_id}).first()
            return to_record(SessionRecord, row) if row else None

        return await self.db.read(work)

    async def open(
        self,
        thread_key: str,
        *,
        source: str,
        kind: SessionKind = "interactive",
        interactive: bool = True,
        ephemeral: bool = False,
        started_by: str = "",
        schedule_id: int | None = None,
        max_rounds: int | None = None,
        max_tokens: int | None = None,
        model: str | None = None,
        fresh: bool = False,
        private: bool = False,
    ) -> SessionRecord:
        """The thread's current session, or a new one (always new with `fresh`, as for /new).
        `private`: the thread is a direct message (its person's memory and earlier sessions)."""

        def work(conn: Connection) -> SessionRecord:
            row = conn.execute(select(threads).where(threads.c.key == thread_key)).first()
            if row is not None and row.session_id is not None and not fresh:
                return to_record(SessionRecord, conn.execute(_SESSION_BY_ID, {"id": row.session_id}).first())
            now = utcnow()
            if row is not None and row.session_id is not None:
                conn.execute(update(sessions).where(sessions.c.id == row.session_id).values(closed_at=now))
            session_id = conn.execute(
                insert(sessions)
                .values(
                    thread_key=thread_key,
                    kind=kind,
                    interactive=interactive,
                    ephemeral=ephemeral,
                    source=source,
                    started_by=started_by,
                    schedule_id=schedule_id,
                    max_rounds=max_rounds,
                    max_tokens=max_tokens,
                    model=model,
                    next_seq=1,
                    notes={},
                    created_at=now,
                    private=private,
                )
                .returning(sessions.c.id)
            ).scalar_one()
            if row is None:
                conn.execute(
                    insert(threads).values(
                        key=thread_key, channel=ThreadKey.channel_of(thread_key), session_id=session_id, created_at=now
                    )
                )
            else:
                conn.execute(update(threads).where(threads.c.key == thread_key).values(session_id=session_id))
            return to_record(SessionRecord, conn.execute(_SESSION_BY_ID, {"id": session_id}).first())

        return await self.db.write(work)

    async def close(self, session_id: int) -> None:
        await self.db.write(
            lambda conn: conn.execute(update(sessions).where(sessions.c.id == session_id).values(closed_at=utcnow()))
        )

    async def closed_before(self, session_ids: Sequence[int], cutoff: datetime) -> set[int]:
        """Which of `session_ids` were closed (by /new, or at the end of a scheduled run) before `cutoff`."""
        if not session_ids:
            return set()
        query = select(sessions.c.id).where(
            sessions.c.id.in_(list(session_ids)), sessions.c.closed_at.is_not(None), sessions.c.closed_at < cutoff
        )
        return await self.db.read(lambda conn: set(conn.execute(query).scalars()))

    async def thread_exists(self, thread_key: str) -> bool:
        return await self.db.read(
            lambda conn: conn.execute(select(threads.c.key).where(threads.c.key == thread_key)).first() is not None
        )

    async def list(self, limit: int = 50) -> list[SessionRecord]:
        def work(conn: Connection) -> list[SessionRecord]:
            rows = conn.execute(select(sessions).order_by(sessions.c.id.desc()).limit(limit)).all()
            return [to_record(SessionRecord, r) for r in rows]

        return await self.db.read(work, large=True)

    # ---- notes (scratchpad) ----------------------------------------------------------------
    async def set_model(self, session_id: int, model: str | None) -> None:
        """The session's model (`/model`): a name of llm.models, None for the default."""
        await self.db.write(
            lambda conn: conn.execute(update(sessions).where(sessions.c.id == session_id).values(model=model))
        )

    async def set_person_model(self, session_id: int, person: str, model: str | None) -> None:
        """One person's model in a shared session (`/model` in a group): a name of llm.models or
        "default"; None forgets their choice (the session's applies to them again)."""

        def work(conn: Connection) -> None:
            query = select(sessions.c.person_models).where(sessions.c.id == session_id)
            chosen = dict(conn.execute(query).scalar() or {})
            if model is None:
                chosen.pop(str(person), None)
            else:
                chosen[str(person)] = model
            conn.execute(update(sessions).where(sessions.c.id == session_id).values(person_models=chosen or None))

        await self.db.write(work)

    async def get_notes(self, session_id: int) -> dict[str, str]:
        return await self.db.read(lambda conn: dict(conn.execute(_NOTES, {"id": session_id}).scalar() or {}))

    async def set_note(self, session_id: int, key: str, value: str | None) -> None:
        def work(conn: Connection) -> None:
            notes = dict(conn.execute(_NOTES, {"id": session_id}).scalar() or {})
            if value is None:
                notes.pop(key, None)
            else:
                notes[key] = value
            conn.execute(update(sessions).where(sessions.c.id == session_id).values(notes=notes))

        await self.db.write(work)

    # ---- messages --------------------------------------------------------------------------
    async def append(self, session_id: int, role: str, content: str, **fields: Any) -> MessageRecord:
        """Append one message (and its tool calls) with the next sequence number; `fields` as
        for `append_in`."""
        return await self.db.write(lambda conn: self.append_in(conn, session_id, role, content, **fields))

    @staticmethod
    def append_in(
        conn: Connection,
        session_id: int,
        role: str,
        content: str,
        *,
        synthetic: bool = False,
        sender_id: str | None = None,
        sender_name: str | None = None,
        run_id: int | None = None,
        reasoning: str | None = None,
        usage: dict[str, Any] | None = None,
        calls: Sequence[NewToolCall] = (),
        fence: Fence | None = None,
        images: Sequence[dict[str, Any]] = (),
        voices: Sequence[dict[str, str]] = (),
        replay: dict[str, Any] | None = None,
    ) -> MessageRecord:
        """`append` inside the caller's transaction. The sequence number is allocated there
        too: the row lock on the session serialises concurrent appends."""
        check_fence(conn, fence)
        seq = conn.execute(_NEXT_SEQ, {"session_id": session_id}).scalar_one()
        now = utcnow()
        message_id = conn.execute(
            _INSERT_MESSAGE,
            {
                "session_id": session_id,
                "seq": seq,
                "role": role,
                "content": content,
                "status": "ok",
                "synthetic": synthetic,
                "reasoning": reasoning or None,
                "usage": usage,
                "sender_id": sender_id,
                "sender_name": sender_name,
                "run_id": run_id,
                "created_at": now,
                **({"images": list(images)} if images else {}),
                **({"voices": list(voices)} if voices else {}),
                **({"replay": replay} if replay else {}),
            },
        ).scalar_one()
        records: list[ToolCallRecord] = []
        for ordinal, call in enumerate(calls):
            call_row_id = conn.execute(
                _INSERT_TOOL_CALL,
                {
                    "message_id": message_id,
                    "session_id": session_id,
                    "call_id": call.call_id,
                    "ordinal": ordinal,
                    "name": call.name,
                    "arguments": call.arguments,
                    "result": call.result,
                    "status": call.status,
                    "note": call.note,
                    "run_id": run_id,
                    "started_at": now,
                },
            ).scalar_one()
            records.append(
                ToolCallRecord(
                    call_row_id,
                    message_id,
                    session_id,
                    call.call_id,
                    ordinal,
                    call.name,
                    call.arguments,
                    call.result,
                    call.status,
                    call.note,
                    run_id,
                )
            )
        return MessageRecord(
            message_id,
            session_id,
            seq,
            role,
            content,
            "ok",
            synthetic,
            reasoning or None,
            usage,
            sender_id,
            sender_name,
            run_id,
            now,
            tuple(records),
            list(voices) or None,
        )

    async def mark_failed(self, message_ids: Iterable[int]) -> None:
        ids = list(message_ids)
        if ids:
            await self.db.write(
                lambda conn: conn.execute(update(messages).where(messages.c.id.in_(ids)).values(status="failed"))
            )

    async def history(self, session_id: int, *, after_seq: int = 0) -> builtins.list[MessageRecord]:
        """Messages in sequence order with their tool calls attached (two queries)."""

        def work(conn: Connection) -> list[MessageRecord]:
            rows = conn.execute(
                select(messages)
                .where(messages.c.session_id == session_id, messages.c.seq > after_seq)
                .order_by(messages.c.seq)
            ).all()
            call_rows = conn.execute(
                select(tool_calls)
                .join(messages, messages.c.id == tool_calls.c.message_id)
                .where(tool_calls.c.session_id == session_id, messages.c.seq > after_seq)
                .order_by(tool_calls.c.message_id, tool_calls.c.ordinal)
            ).all()
            by_message: dict[int, list[ToolCallRecord]] = defaultdict(list)
            for row in call_rows:
                by_message[row.message_id].append(to_record(ToolCallRecord, row))
            return [to_record(MessageRecord, r, tool_calls=tuple(by_message.get(r.id, ()))) for r in rows]

        return await self.db.read(work, large=after_seq == 0)

    async def count(self, session_id: int) -> int:
        return await self.db.read(
            lambda conn: conn.execute(
                select(func.count()).select_from(messages).where(messages.c.session_id == session_id)
            ).scalar_one()
        )

    # ---- tool calls ------------------------------------------------------------------------
    async def set_tool_call(
        self,
        tool_call_id: int,
        *,
        status: str,
        result: str | None = None,
        note: str | None = None,
        fence: Fence | None = None,
        audit: AuditEntry | None = None,
    ) -> None:
        """`audit`: the trail's row of the call's outcome, written in the same transaction."""
        await self.db.write(
            lambda conn: self.set_tool_call_in(
                conn, tool_call_id, status=status, result=result, note=note, fence=fence, audit=audit
            )
        )

    @staticmethod
    def set_tool_call_in(
        conn: Connection,
        tool_call_id: int,
        *,
        status: str,
        result: str | None = None,
        note: str | None = None,
        fence: Fence | None = None,
        audit: AuditEntry | None = None,
    ) -> None:
        """`set_tool_call` inside the caller's transaction."""
        values: dict[str, Any] = {"status": status}
        if result is not None:
            values["result"] = result
        if note is not None:
            values["note"] = note
        if status not in ("running", "pending"):
            values["finished_at"] = utcnow()
        check_fence(conn, fence)
        conn.execute(_SET_TOOL_CALL, {"tool_call_id": tool_call_id, **values})
        if audit is not None:
            AuditRepo.record_in(conn, audit)

    async def get_tool_call(self, tool_call_id: int) -> ToolCallRecord | None:
        def work(conn: Connection) -> ToolCallRecord | None:
            row = conn.execute(select(tool_calls).where(tool_calls.c.id == tool_call_id)).first()
            return to_record(ToolCallRecord, row) if row else None

        return await self.db.read(work)

    async def open_tool_calls(self, session_id: int) -> builtins.list[ToolCallRecord]:
        """Calls not yet finished (running or pending), in declared order."""
        return await self.db.read(
            lambda conn: [
                to_record(ToolCallRecord, r) for r in conn.execute(_OPEN_TOOL_CALLS, {"session_id": session_id})
            ]
        )
