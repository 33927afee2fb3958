"""The only package that touches the database. Everything it returns is a plain dataclass."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import bindparam, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError

from gateway.events import utcnow
from gateway.store.access import AccessGrantRecord, AccessRepo, AccessRequestRecord
from gateway.store.audit import AuditEntry, AuditRecord, AuditRepo, redact, redact_arguments
from gateway.store.base import Fence, LeaseLost
from gateway.store.budgets import BudgetRepo, CounterKey, CounterRecord, Limit, Refused, Reserved
from gateway.store.claims import ClaimRepo
from gateway.store.console import ConsoleRepo, InstanceBeat, LoginSession, OverviewCounts
from gateway.store.conversation import ConversationRepo, Feedback
from gateway.store.db import (
    Database,
    ensure_migrated,
    migrations_current,
    upgrade,
)
from gateway.store.delegations import ChildSession, DelegationRepo, NewTask, TaskRecord
from gateway.store.failures import StoreError, connection_failure
from gateway.store.gauges import GaugeRepo, Gauges
from gateway.store.history import HistoryRepo
from gateway.store.holds import HoldRepo
from gateway.store.inbox import InboxRepo, NewItem
from gateway.store.job_spend import JobSpendRepo
from gateway.store.mcp_tokens import McpTokenRepo
from gateway.store.memory import MemoryFull, MemoryRecord, MemoryRepo, OwnerSummary, Saved
from gateway.store.outbox import OutboxRepo
from gateway.store.preferences import PreferenceRepo
from gateway.store.prompts import DecideResult, PromptRepo
from gateway.store.records import *  # noqa: F403 - the record types are the store's vocabulary
from gateway.store.retention import RetentionDays, RetentionRepo
from gateway.store.runs import RunRepo
from gateway.store.schedules import ScheduleRepo
from gateway.store.sessions import SessionRepo
from gateway.store.skills import SkillPin, SkillRepo
from gateway.store.tables import inbox

log = logging.getLogger(__name__)
T = TypeVar("T")

_MARK_DONE = update(inbox).where(inbox.c.id == bindparam("item_id")).values(status="done")


@dataclass(frozen=True)
class RecordedRound:
    message: MessageRecord  # noqa: F405
    event_seqs: list[int] | None  # None: the trace write failed (the round was written without it)
    reply: OutboxRecord | None  # noqa: F405


@dataclass(frozen=True)
class BeforeMessage:
    prompts: list[PromptRecord]  # noqa: F405 - the thread's pending prompts
    session: SessionRecord | None  # noqa: F405 - its current session
    resume_waits: bool  # a decided prompt's resume is queued: the resumed turn goes first


@dataclass(frozen=True)
class StartedTurn:
    rows: list[MessageRecord]  # noqa: F405
    run: RunRecord  # noqa: F405


def _consume_in(
    conn: Connection, session_id: int, items: list[tuple[int, dict]], fence: Fence | None, run_id: int | None
) -> list:
    records = []
    for item_id, payload in items:
        sender = payload.get("sender") or {}
        # `content` is the text with its attachments made readable (gateway/attachments).
        records.append(
            SessionRepo.append_in(
                conn,
                session_id,
                "user",
                str(payload.get("content", payload.get("text", ""))),
                synthetic=sender.get("id") == "scheduler",
                sender_id=sender.get("id"),
                sender_name=sender.get("name"),
                run_id=run_id,
                fence=fence,
                images=payload.get("images") or (),
                voices=payload.get("voices") or (),
            )
        )
        if run_id is not None:
            _count_transcriptions(conn, run_id, payload)
        for done_id in (item_id, *payload.get("merged_items", ()), *payload.get("context_items", ())):
            conn.execute(_MARK_DONE, {"item_id": done_id, "done_at": utcnow(), "session_id": session_id})
        # The history row it became: a deletion of the message later redacts that row.
        stored = conn.execute(select(inbox.c.payload).where(inbox.c.id == item_id)).scalar()
        if isinstance(stored, dict) and "message_id" in stored:
            recorded = {**stored, "history_row": records[-1].id}
            conn.execute(update(inbox).where(inbox.c.id == item_id).values(payload=recorded))
    return records


def _count_transcriptions(conn: Connection, run_id: int, payload: dict) -> None:
    """The transcriptions of a message's audio, made before its turn (gateway/attachments),
    counted on the run it joins: once, in the write that consumes the message."""
    for attachment in payload.get("attachments") or ():
        heard = (attachment or {}).get("outcome") or {}
        if not heard.get("transcribed_by"):
            continue
        cost = heard.get("cost_nano_usd")
        event = {
            "model": heard["transcribed_by"],
            "file": heard.get("name") or heard.get("path") or "",
            "seconds": heard.get("heard_seconds") or 0,
            "cost_nano_usd": cost,
        }
        RunRepo.add_events_in(conn, run_id, [("TRANSCRIPTION", event, None)], llm_calls=1, cost_nano_usd=cost,
                              unpriced=cost is None)


class _TraceFailed(Exception):
    """The trace part of a write failed (the transaction is rolled back and retried)."""


def _add_trace(
    conn: Connection, run_id: int, events: Sequence[tuple[str, dict, int | None]], totals: dict | None
) -> list[int]:
    try:
        return RunRepo.add_events_in(conn, run_id, list(events), **(totals or {}))
    except Exception as exc:  # whatever the trace write raised: the caller retries without it
        raise _TraceFailed from exc


class Store:
    def __init__(self, url: str, **options: Any):
        """`options`: the database's (echo, pg_schema, pool sizes, application_name: `Database`)."""
        self.db = Database(url, **options)
        self.sessions = SessionRepo(self.db)
        self.runs = RunRepo(self.db)
        self.inbox = InboxRepo(self.db)
        self.prompts = PromptRepo(self.db)
        self.outbox = OutboxRepo(self.db)
        self.schedules = ScheduleRepo(self.db)
        self.job_spend = JobSpendRepo(self.db)
        self.history = HistoryRepo(self.db)
        self.delegations = DelegationRepo(self.db)
        self.retention = RetentionRepo(self.db)
        self.access = AccessRepo(self.db)
        self.budgets = BudgetRepo(self.db)
        self.audit = AuditRepo(self.db)
        self.console = ConsoleRepo(self.db)
        self.conversation = ConversationRepo(self.db)
        self.gauges = GaugeRepo(self.db)
        self.holds = HoldRepo(self.db)
        self.mcp_tokens = McpTokenRepo(self.db)
        self.memory = MemoryRepo(self.db)
        self.claims = ClaimRepo(self.db)
        self.skills = SkillRepo(self.db)
        self.preferences = PreferenceRepo(self.db)

    @property
    def is_sqlite(self) -> bool:
        return self.db.is_sqlite

    async def before_message(self, thread_key: str) -> BeforeMessage:
        """What handling an inbound message starts from, in one read: the thread's pending
        prompts, its current session and whether a decided prompt's resume waits (read last,
        so it sees any decision of a prompt the first statement no longer found pending)."""

        def work(conn: Connection) -> BeforeMessage:
            prompts = PromptRepo.pending_in_thread_in(conn, thread_key)
            session = SessionRepo.current_in(conn, thread_key)
            return BeforeMessage(prompts, session, InboxRepo.resume_waits_in(conn, thread_key))

        return await self.db.read(work)

    async def consume_messages(
        self, session_id: int, items: list[tuple[int, dict]], *, fence: Fence | None = None, run_id: int | None = None
    ) -> list[MessageRecord]:  # noqa: F405
        """Append inbox messages to a session as user rows and mark the items done, in one
        transaction: a crash can neither lose them nor append them twice. `run_id`: the running
        turn they join (their transcriptions are counted on it)."""
        def work(conn: Connection) -> list:
            rows = _consume_in(conn, session_id, items, fence, None)  # the turn's rows name its run, these not
            if run_id is not None:
                for _, payload in items:
                    _count_transcriptions(conn, run_id, payload)
            return rows

        return await self.db.write(work)

    async def start_turn(
        self,
        session_id: int,
        thread_key: str,
        items: list[tuple[int, dict]],
        *,
        model: str | None = None,
        fence: Fence | None = None,
    ) -> StartedTurn:
        """`consume_messages` and the run they start, in one transaction (the rows name the run)."""

        def work(conn: Connection) -> StartedTurn:
            run = RunRepo.start_in(conn, session_id, thread_key, model=model)
            return StartedTurn(_consume_in(conn, session_id, items, fence, run.id), run)

        return await self.db.write(work)

    async def record_round(
        self,
        session_id: int,
        content: str,
        *,
        run_id: int,
        reasoning: str | None = None,
        usage: dict | None = None,
        calls: Sequence[NewToolCall] = (),  # noqa: F405
        fence: Fence | None = None,
        events: Sequence[tuple[str, dict, int | None]] = (),
        totals: dict | None = None,
        reply: tuple[str, str, dict] | None = None,
        replay: dict | None = None,
    ) -> RecordedRound:
        """One LLM round in one transaction: the assistant message, the run's trace `events` and
        `totals`, and, when the round has text to show, the intent to deliver it: `reply` is
        (key prefix, thread key, payload) and the key is the prefix plus the message id.

        If the trace part fails, the round is written again without it and the result says so
        (`event_seqs` None): observability must never fail a turn."""

        def work(conn: Connection, with_trace: bool) -> RecordedRound:
            message = SessionRepo.append_in(
                conn,
                session_id,
                "assistant",
                content,
                reasoning=reasoning,
                usage=usage,
                run_id=run_id,
                calls=calls,
                fence=fence,
                replay=replay,
            )
            seqs = _add_trace(conn, run_id, events, totals) if with_trace else None
            record = None
            if reply is not None:
                prefix, thread_key, payload = reply
                record = OutboxRepo.record_in(
                    conn, f"{prefix}{message.id}", thread_key, "message", payload, fence=fence
                )
            return RecordedRound(message, seqs, record)

        return await self._write_traced(work, run_id, events)

    async def settle_tool_call(
        self,
        tool_call_id: int,
        *,
        status: str,
        result: str,
        note: str | None = None,
        fence: Fence | None = None,
        audit: AuditEntry | None = None,
        run_id: int,
        events: Sequence[tuple[str, dict, int | None]] = (),
        totals: dict | None = None,
    ) -> None:
        """A tool call's result, its row of the audit trail and its trace (`events` and `totals`
        of run `run_id`) in one transaction; a failing trace part as in `record_round`."""

        def work(conn: Connection, with_trace: bool) -> None:
            SessionRepo.set_tool_call_in(
                conn, tool_call_id, status=status, result=result, note=note, fence=fence, audit=audit
            )
            if with_trace and (events or totals):
                _add_trace(conn, run_id, events, totals)

        await self._write_traced(work, run_id, events)

    async def _write_traced(
        self, work: Callable[[Connection, bool], T], run_id: int, events: Sequence[tuple[str, dict, int | None]]
    ) -> T:
        """`work(conn, with_trace=True)` in one write; if its trace part fails, the write again
        without it: observability must never fail a turn."""
        try:
            return await self.db.write(lambda conn: work(conn, True))
        except _TraceFailed as failed:
            log.error(
                "run %s: could not record %s",
                run_id,
                ", ".join(kind for kind, _, _ in events),
                exc_info=failed.__cause__,
            )
            return await self.db.write(lambda conn: work(conn, False))

    async def migrate(self, *, auto: bool = True, applied: list[str] | None = None) -> str | None:
        """Open the database (the first connection) and bring its schema up to date; returns the
        revision it was at, None for a new database. A failure to connect is one line naming
        database.url (`StoreError`)."""
        try:
            return await ensure_migrated(self.db, auto_migrate=auto, applied=applied)
        except (SQLAlchemyError, OSError) as exc:
            if (failure := connection_failure(exc, self.db.parsed_url)) is None:
                raise
            raise failure from exc

    async def close(self) -> None:
        await self.db.dispose()


__all__ = [
    "Store",
    "RecordedRound",
    "StartedTurn",
    "BeforeMessage",
    "Database",
    "StoreError",
    "Fence",
    "LeaseLost",
    "NewItem",
    "DecideResult",
    "ChildSession",
    "NewTask",
    "TaskRecord",
    "RetentionDays",
    "upgrade",
    "migrations_current",
    "AccessRepo",
    "AccessRequestRecord",
    "AccessGrantRecord",
    "BudgetRepo",
    "CounterKey",
    "CounterRecord",
    "Limit",
    "Refused",
    "Reserved",
    "Gauges",
    "AuditEntry",
    "AuditRecord",
    "AuditRepo",
    "redact",
    "redact_arguments",
    "ConsoleRepo",
    "ConversationRepo",
    "Feedback",
    "InstanceBeat",
    "LoginSession",
    "OverviewCounts",
    "MemoryFull",
    "MemoryRecord",
    "MemoryRepo",
    "OwnerSummary",
    "Saved",
    "SkillPin",
    "SkillRepo",
]
