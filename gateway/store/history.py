"""History as the context builder reads it: lean rows, compaction markers, and the search over
folded spans (its queries in `history_search.py`).

The context builder calls these every round, so the row reader selects only what is rendered
(no reasoning, no usage) and can read just the rows that changed. Compaction markers are written
with a compare-and-set on the session's latest marker, so two builders never fold the same span.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, bindparam, insert, literal, select, union, union_all
from sqlalchemy.engine import Connection

from gateway.events import utcnow
from gateway.store.base import Repo, to_record
from gateway.store.history_search import HistoryHit, SessionHit, search_folded, search_sessions
from gateway.store.tables import compactions, messages, sessions, tool_calls

# Reads of more rows than this (over ~5 ms of work: a whole history, as on a first build) run
# off the event loop.
LARGE_READ_ROWS = 250


@dataclass(frozen=True)
class HistoryCall:
    call_id: str
    name: str
    arguments: str
    result: str | None
    status: str
    note: str | None


@dataclass(frozen=True)
class HistoryRow:
    """A message row with what the model may see (reasoning and usage are left out on purpose)."""

    id: int
    seq: int
    role: str
    content: str
    status: str
    synthetic: bool
    created_at: datetime
    calls: tuple[HistoryCall, ...] = ()
    images: tuple[dict, ...] = ()  # user rows: {path, mime, width, height} per image sent
    # assistant rows: what the model's API needs back within the turn ({"api", "data"}: signed
    # thinking blocks, encrypted reasoning items), opaque here
    replay: dict | None = None


@dataclass(frozen=True)
class CompactionRecord:
    id: int
    session_id: int
    first_seq: int
    last_seq: int
    summary: str
    folded_text: str
    tokens_before: int | None
    tokens_after: int | None
    created_at: datetime


@dataclass(frozen=True)
class RowChanges:
    """Rows at or before a point that changed since a time: finished or open calls, failed rows."""

    touched: frozenset[int]
    failed: frozenset[int]


@dataclass(frozen=True)
class RoundReads:
    """What a round of the context builder reads, in one go (see HistoryRepo.round_reads)."""

    marker: CompactionRecord | None
    changes: RowChanges
    tail: list[HistoryRow]


# Statements of every round of the context builder, built once (building one costs more than
# running it). Rows are chosen either after a sequence number or by a list of them.
def _rows_statement(which: ColumnElement[bool]) -> Select:
    return (
        select(
            messages.c.id,
            messages.c.seq,
            messages.c.role,
            messages.c.content,
            messages.c.status,
            messages.c.synthetic,
            messages.c.created_at,
            messages.c.images,
            messages.c.replay,
        )
        .where(messages.c.session_id == bindparam("session_id"), which)
        .order_by(messages.c.seq)
    )


def _calls_statement(which: ColumnElement[bool]) -> Select:
    return (
        select(
            tool_calls.c.message_id,
            tool_calls.c.call_id,
            tool_calls.c.name,
            tool_calls.c.arguments,
            tool_calls.c.result,
            tool_calls.c.status,
            tool_calls.c.note,
        )
        .join(messages, messages.c.id == tool_calls.c.message_id)
        .where(
            tool_calls.c.session_id == bindparam("session_id"), messages.c.session_id == bindparam("session_id"), which
        )
        .order_by(tool_calls.c.message_id, tool_calls.c.ordinal)
    )


_CALLS_OF_MESSAGES = (
    select(
        tool_calls.c.message_id,
        tool_calls.c.call_id,
        tool_calls.c.name,
        tool_calls.c.arguments,
        tool_calls.c.result,
        tool_calls.c.status,
        tool_calls.c.note,
    )
    .where(tool_calls.c.message_id.in_(bindparam("message_ids", expanding=True)))
    .order_by(tool_calls.c.message_id, tool_calls.c.ordinal)
)
CALLS_BY_ID_MAX = 500  # above this many rows, their calls are read with one join instead

_AFTER_SEQ = messages.c.seq > bindparam("after_seq")
_IN_SEQS = messages.c.seq.in_(bindparam("seqs", expanding=True))
_ROWS_AFTER = _rows_statement(_AFTER_SEQ)
_CALLS_AFTER = _calls_statement(_AFTER_SEQ)
_ROWS_IN = _rows_statement(_IN_SEQS)
_CALLS_IN = _calls_statement(_IN_SEQS)
_NEXT_SEQ = select(sessions.c.next_seq).where(sessions.c.id == bindparam("session_id"))

_IN_WINDOW = (messages.c.seq > bindparam("after_seq"), messages.c.seq < bindparam("before_seq"))


def _calls_where(condition: ColumnElement[bool]) -> Select:
    return select(tool_calls.c.message_id).where(tool_calls.c.session_id == bindparam("session_id"), condition)


# Rows whose calls finished since the last read or are still open. The calls are found first
# (a union, not an OR: each half is an index range, ix_tool_calls_session_finished and
# ix_tool_calls_session_status), then their messages by id: a shape no planner estimate can turn
# into a scan of the whole session per call.
_TOUCHED_SEQS = select(messages.c.seq, literal(False).label("failed")).where(
    messages.c.session_id == bindparam("session_id"),
    *_IN_WINDOW,
    messages.c.id.in_(
        union(
            _calls_where(tool_calls.c.finished_at >= bindparam("since")),
            _calls_where(tool_calls.c.status.in_(("running", "pending"))),
        )
    ),
)
_FAILED_SEQS = select(messages.c.seq, literal(True).label("failed")).where(
    messages.c.session_id == bindparam("session_id"), *_IN_WINDOW, messages.c.status == "failed"
)
_CHANGES = union_all(_TOUCHED_SEQS, _FAILED_SEQS)  # (seq, failed) pairs in one statement
_FIRST_USER_SEQ = (
    select(messages.c.seq)
    .where(
        messages.c.session_id == bindparam("session_id"),
        messages.c.role == "user",
        messages.c.synthetic.is_(False),
        messages.c.status == "ok",
    )
    .order_by(messages.c.seq)
    .limit(1)
)
_LATEST_COMPACTION = (
    select(compactions)
    .where(compactions.c.session_id == bindparam("session_id"))
    .order_by(compactions.c.id.desc())
    .limit(1)
)


class HistoryRepo(Repo):
    # ---- rows ------------------------------------------------------------------------------
    async def rows(self, session_id: int, *, after_seq: int = 0, seqs: Iterable[int] | None = None) -> list[HistoryRow]:
        """Rows after `after_seq` (or exactly `seqs`), in sequence order, failed ones included."""
        if seqs is not None:
            wanted = sorted(set(seqs))
            if not wanted:
                return []
            params = {"session_id": session_id, "seqs": wanted}
            return await self.db.read(
                lambda conn: _read_rows(conn, _ROWS_IN, _CALLS_IN, params), large=len(wanted) > LARGE_READ_ROWS
            )
        params = {"session_id": session_id, "after_seq": after_seq}
        # A whole history (a first build, a reload after a fold elsewhere): on the loop when it
        # is short, counted first in the same read; else on a reader thread. PostgreSQL needs no
        # count. (A round's few new rows come with `round_reads`.)
        if self.db.is_sqlite:
            found = await self.db.read(
                lambda conn: None if _many_rows_after(conn, params) else _read_after(conn, params)
            )
            if found is not None:
                return found
        return await self.db.read(lambda conn: _read_after(conn, params), large=True)

    async def round_reads(
        self, session_id: int, *, after_seq: int, before_seq: int, since: datetime, tail_after: int
    ) -> RoundReads:
        """One round's reads in one: the latest compaction marker, what may have changed in
        (after_seq, before_seq) since `since` (calls finished or still open, failed rows: indexed
        ranges) and the rows after `tail_after` (a round's few new rows, read on the loop)."""
        params = {"session_id": session_id, "after_seq": after_seq, "before_seq": before_seq, "since": since}

        def work(conn: Connection) -> RoundReads:
            marker = conn.execute(_LATEST_COMPACTION, params).first()
            tail = _read_after(conn, {"session_id": session_id, "after_seq": tail_after})
            return RoundReads(to_record(CompactionRecord, marker) if marker else None, _changes(conn, params), tail)

        return await self.db.read(work)

    async def first_user_row(self, session_id: int) -> HistoryRow | None:
        """The session's first real (not synthetic, not failed) user message: its task."""

        def work(conn: Connection) -> HistoryRow | None:
            seq = conn.execute(_FIRST_USER_SEQ, {"session_id": session_id}).scalar()
            if seq is None:
                return None
            found = _read_rows(conn, _ROWS_IN, _CALLS_IN, {"session_id": session_id, "seqs": [seq]})
            return found[0] if found else None

        return await self.db.read(work)

    # ---- compaction markers ----------------------------------------------------------------
    async def latest_compaction(self, session_id: int) -> CompactionRecord | None:
        def work(conn: Connection) -> CompactionRecord | None:
            row = conn.execute(_LATEST_COMPACTION, {"session_id": session_id}).first()
            return to_record(CompactionRecord, row) if row else None

        return await self.db.read(work)

    async def compactions(self, session_id: int) -> list[CompactionRecord]:
        def work(conn: Connection) -> list[CompactionRecord]:
            rows = conn.execute(
                select(compactions).where(compactions.c.session_id == session_id).order_by(compactions.c.id)
            ).all()
            return [to_record(CompactionRecord, r) for r in rows]

        return await self.db.read(work)

    async def add_compaction(
        self,
        session_id: int,
        *,
        expected_last_seq: int,
        first_seq: int,
        last_seq: int,
        summary: str,
        folded_text: str,
        tokens_before: int | None = None,
        tokens_after: int | None = None,
    ) -> CompactionRecord | None:
        """Record a fold in one transaction; None when another fold moved the marker first."""
        if not summary.strip():
            raise ValueError("a compaction needs a non-empty summary")
        if last_seq < first_seq or first_seq <= expected_last_seq:
            raise ValueError(f"fold range {first_seq}..{last_seq} does not follow the marker at {expected_last_seq}")

        def work(conn: Connection) -> CompactionRecord | None:
            # Lock the session row (PostgreSQL) so concurrent folds serialise on the check below.
            conn.execute(select(sessions.c.id).where(sessions.c.id == session_id).with_for_update())
            current = conn.execute(
                select(compactions.c.last_seq)
                .where(compactions.c.session_id == session_id)
                .order_by(compactions.c.id.desc())
                .limit(1)
            ).scalar()
            if (current or 0) != expected_last_seq:
                return None
            values: dict[str, Any] = dict(
                session_id=session_id,
                first_seq=first_seq,
                last_seq=last_seq,
                summary=summary,
                folded_text=folded_text,
                tokens_before=tokens_before,
                tokens_after=tokens_after,
                created_at=utcnow(),
            )
            new_id = conn.execute(insert(compactions).values(**values).returning(compactions.c.id)).scalar_one()
            return CompactionRecord(id=new_id, **values)

        return await self.db.write(work)

    async def search(self, thread_key: str, query: str, *, limit: int = 5) -> list[HistoryHit]:
        """Folded spans of the thread's sessions matching `query`: all words first, then any."""
        return await search_folded(self.db, thread_key, query, limit=limit)

    async def search_sessions(
        self, thread_key: str, current_session: int, query: str, *, person: tuple[str, str] | None, limit: int = 5
    ) -> list[SessionHit]:
        """Messages of earlier sessions: the thread's, and with `person` their direct messages'."""
        return await search_sessions(
            self.db, thread_key=thread_key, current_session=current_session, person=person, query=query, limit=limit
        )



def _read_rows(conn: Connection, rows_statement: Select, calls_statement: Select, params: dict) -> list[HistoryRow]:
    rows = conn.execute(rows_statement, params).all()
    asking = [r.id for r in rows if r.role == "assistant"]  # only assistant rows have calls
    if len(asking) > CALLS_BY_ID_MAX:
        calls = _calls(conn, calls_statement, params)  # a whole history: one join
    else:
        # A few rows: their calls by message id, one index range each. (A join on the rows'
        # seqs let PostgreSQL pick a scan of every message per call when its statistics had not
        # seen the newest rows yet: 100 ms a round at 3,000 rows.)
        calls = _calls(conn, _CALLS_OF_MESSAGES, {"message_ids": asking}) if asking else {}
    return [
        HistoryRow(
            r.id,
            r.seq,
            r.role,
            r.content or "",
            r.status,
            bool(r.synthetic),
            r.created_at,
            calls.get(r.id, ()),
            tuple(r.images or ()),
            r.replay,
        )
        for r in rows
    ]


def _changes(conn: Connection, params: dict) -> RowChanges:
    touched: set[int] = set()
    failed: set[int] = set()
    for seq, is_failed in conn.execute(_CHANGES, params):
        (failed if is_failed else touched).add(seq)
    return RowChanges(frozenset(touched), frozenset(failed))


def _read_after(conn: Connection, params: dict) -> list[HistoryRow]:
    return _read_rows(conn, _ROWS_AFTER, _CALLS_AFTER, params)


def _many_rows_after(conn: Connection, params: dict) -> bool:
    """Whether more than LARGE_READ_ROWS rows may follow `after_seq`: a whole history, as on a
    first build, rather than a round's few new rows (next_seq bounds the count from above)."""
    next_seq = conn.execute(_NEXT_SEQ, params).scalar()
    return next_seq is not None and next_seq - 1 - params["after_seq"] > LARGE_READ_ROWS


def _calls(conn: Connection, statement: Select, params: dict) -> dict[int, tuple[HistoryCall, ...]]:
    by_message: dict[int, list[HistoryCall]] = defaultdict(list)
    for r in conn.execute(statement, params):
        by_message[r.message_id].append(HistoryCall(r.call_id, r.name, r.arguments or "{}", r.result, r.status, r.note))
    return {k: tuple(v) for k, v in by_message.items()}


__all__ = [
    "CompactionRecord",
    "HistoryCall",
    "HistoryRepo",
    "HistoryRow",
    "RowChanges",
]
