"""History as the context builder reads it: lean rows, compaction markers, full-text search.

The context builder calls these every round, so the row reader selects only what is rendered
(no reasoning, no usage) and can read just the rows that changed. Compaction markers are written
with a compare-and-set on the session's latest marker, so two builders never fold the same span.
Folded spans are searchable through SQLite FTS5 (`compactions_fts`, kept by triggers) or a
PostgreSQL GIN index over `to_tsvector('english', summary || ' ' || folded_text)` (migration 0002).
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Iterable

from sqlalchemy import insert, or_, select, text
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.store.base import Repo, to_record, utcnow
from gateway.store.tables import UTCDateTime, compactions, messages, sessions, tool_calls

MAX_QUERY_WORDS = 16
_WORD = re.compile(r"\w+", re.UNICODE)


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
class HistoryHit:
    compaction_id: int
    session_id: int
    first_seq: int
    last_seq: int
    summary: str
    snippet: str
    first_at: datetime | None
    last_at: datetime | None
    folded_at: datetime


def query_words(query: str) -> list[str]:
    """The searchable words of a free-text query (punctuation and FTS syntax dropped)."""
    return _WORD.findall(query)[:MAX_QUERY_WORDS]


class HistoryRepo(Repo):
    # ---- rows ------------------------------------------------------------------------------
    async def rows(self, session_id: int, *, after_seq: int = 0, seqs: Iterable[int] | None = None) -> list[HistoryRow]:
        """Rows after `after_seq` (or exactly `seqs`), in sequence order, failed ones included."""
        wanted = sorted(set(seqs)) if seqs is not None else None
        if wanted is not None and not wanted:
            return []
        where = [messages.c.session_id == session_id]
        where.append(messages.c.seq.in_(wanted) if wanted is not None else messages.c.seq > after_seq)
        async with self.db.read() as conn:
            rows = (
                await conn.execute(
                    select(
                        messages.c.id, messages.c.seq, messages.c.role, messages.c.content,
                        messages.c.status, messages.c.synthetic, messages.c.created_at,
                    ).where(*where).order_by(messages.c.seq)
                )
            ).all()
            calls = await self._calls(conn, session_id, where) if rows else {}
        return [
            HistoryRow(r.id, r.seq, r.role, r.content or "", r.status, bool(r.synthetic), r.created_at, calls.get(r.id, ()))
            for r in rows
        ]

    @staticmethod
    async def _calls(conn: AsyncConnection, session_id: int, where: list) -> dict[int, tuple[HistoryCall, ...]]:
        rows = (
            await conn.execute(
                select(
                    tool_calls.c.message_id, tool_calls.c.call_id, tool_calls.c.name, tool_calls.c.arguments,
                    tool_calls.c.result, tool_calls.c.status, tool_calls.c.note,
                )
                .join(messages, messages.c.id == tool_calls.c.message_id)
                .where(tool_calls.c.session_id == session_id, *where)
                .order_by(tool_calls.c.message_id, tool_calls.c.ordinal)
            )
        ).all()
        by_message: dict[int, list[HistoryCall]] = defaultdict(list)
        for r in rows:
            by_message[r.message_id].append(HistoryCall(r.call_id, r.name, r.arguments or "{}", r.result, r.status, r.note))
        return {k: tuple(v) for k, v in by_message.items()}

    async def changes(self, session_id: int, *, after_seq: int, before_seq: int, since: datetime) -> RowChanges:
        """What may have changed in (after_seq, before_seq) since `since` (cheap: two indexed scans)."""
        async with self.db.read() as conn:
            touched = (
                await conn.execute(
                    select(messages.c.seq)
                    .join(tool_calls, tool_calls.c.message_id == messages.c.id)
                    .where(
                        tool_calls.c.session_id == session_id,
                        messages.c.seq > after_seq,
                        messages.c.seq < before_seq,
                        or_(tool_calls.c.finished_at >= since, tool_calls.c.status.in_(("running", "pending"))),
                    )
                    .distinct()
                )
            ).scalars().all()
            failed = (
                await conn.execute(
                    select(messages.c.seq).where(
                        messages.c.session_id == session_id,
                        messages.c.seq > after_seq,
                        messages.c.seq < before_seq,
                        messages.c.status == "failed",
                    )
                )
            ).scalars().all()
        return RowChanges(frozenset(touched), frozenset(failed))

    async def first_user_row(self, session_id: int) -> HistoryRow | None:
        """The session's first real (not synthetic, not failed) user message: its task."""
        async with self.db.read() as conn:
            seq = (
                await conn.execute(
                    select(messages.c.seq)
                    .where(
                        messages.c.session_id == session_id,
                        messages.c.role == "user",
                        messages.c.synthetic.is_(False),
                        messages.c.status == "ok",
                    )
                    .order_by(messages.c.seq)
                    .limit(1)
                )
            ).scalar()
        if seq is None:
            return None
        found = await self.rows(session_id, seqs=[seq])
        return found[0] if found else None

    # ---- compaction markers ----------------------------------------------------------------
    async def latest_compaction(self, session_id: int) -> CompactionRecord | None:
        async with self.db.read() as conn:
            row = (
                await conn.execute(
                    select(compactions).where(compactions.c.session_id == session_id).order_by(compactions.c.id.desc()).limit(1)
                )
            ).first()
        return to_record(CompactionRecord, row) if row else None

    async def compactions(self, session_id: int) -> list[CompactionRecord]:
        async with self.db.read() as conn:
            rows = (
                await conn.execute(select(compactions).where(compactions.c.session_id == session_id).order_by(compactions.c.id))
            ).all()
        return [to_record(CompactionRecord, r) for r in rows]

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
        async with self.db.write() as conn:
            # Lock the session row (PostgreSQL) so concurrent folds serialise on the check below.
            await conn.execute(select(sessions.c.id).where(sessions.c.id == session_id).with_for_update())
            current = (
                await conn.execute(
                    select(compactions.c.last_seq)
                    .where(compactions.c.session_id == session_id)
                    .order_by(compactions.c.id.desc())
                    .limit(1)
                )
            ).scalar()
            if (current or 0) != expected_last_seq:
                return None
            now = utcnow()
            values = dict(
                session_id=session_id, first_seq=first_seq, last_seq=last_seq, summary=summary,
                folded_text=folded_text, tokens_before=tokens_before, tokens_after=tokens_after, created_at=now,
            )
            new_id = (await conn.execute(insert(compactions).values(**values).returning(compactions.c.id))).scalar_one()
        return CompactionRecord(id=new_id, **values)

    # ---- search ----------------------------------------------------------------------------
    async def search(self, thread_key: str, query: str, *, limit: int = 5) -> list[HistoryHit]:
        """Folded spans of the thread's sessions matching `query`: all words first, then any."""
        words = query_words(query)
        if not words:
            return []
        for mode in ("all", "any"):
            hits = await self._search(thread_key, words, mode, limit)
            if hits or len(words) == 1:
                return hits
        return []

    async def _search(self, thread_key: str, words: list[str], mode: str, limit: int) -> list[HistoryHit]:
        if self.db.is_sqlite:
            joiner = " " if mode == "all" else " OR "
            statement = _SQLITE_SEARCH
            match = joiner.join('"' + w.replace('"', "") + '"' for w in words)
        else:
            joiner = " & " if mode == "all" else " | "
            statement = _PG_SEARCH
            match = joiner.join(words)
        params = {"thread": thread_key, "match": match, "limit": limit}
        async with self.db.read() as conn:
            rows = (await conn.execute(statement, params)).all()
        return [
            HistoryHit(r.id, r.session_id, r.first_seq, r.last_seq, r.summary, r.snip or "", r.first_at, r.last_at, r.created_at)
            for r in rows
        ]


_SPAN_DATES = """
    (SELECT m.created_at FROM messages m WHERE m.session_id = c.session_id AND m.seq = c.first_seq) AS first_at,
    (SELECT m.created_at FROM messages m WHERE m.session_id = c.session_id AND m.seq = c.last_seq) AS last_at
"""
_COLUMNS = dict(created_at=UTCDateTime, first_at=UTCDateTime, last_at=UTCDateTime)

_SQLITE_SEARCH = text(
    f"""
    SELECT c.id, c.session_id, c.first_seq, c.last_seq, c.summary, c.created_at,
           snippet(compactions_fts, 1, '«', '»', '…', 24) AS snip, {_SPAN_DATES}
    FROM compactions_fts
    JOIN compactions c ON c.id = compactions_fts.rowid
    JOIN sessions s ON s.id = c.session_id
    WHERE compactions_fts MATCH :match AND s.thread_key = :thread
    ORDER BY bm25(compactions_fts), c.id DESC
    LIMIT :limit
    """
).columns(**_COLUMNS)

# The tsvector expression must match the index of migration 0002 for the index to be used.
_PG_SEARCH = text(
    f"""
    SELECT c.id, c.session_id, c.first_seq, c.last_seq, c.summary, c.created_at,
           ts_headline('english', c.folded_text, q,
                       'StartSel=«, StopSel=», MaxWords=30, MinWords=12, MaxFragments=2, FragmentDelimiter=" … "') AS snip,
           {_SPAN_DATES}
    FROM compactions c
    JOIN sessions s ON s.id = c.session_id,
         to_tsquery('english', :match) AS q
    WHERE s.thread_key = :thread
      AND to_tsvector('english'::regconfig, c.summary || ' ' || c.folded_text) @@ q
    ORDER BY ts_rank(to_tsvector('english'::regconfig, c.summary || ' ' || c.folded_text), q) DESC, c.id DESC
    LIMIT :limit
    """
).columns(**_COLUMNS)

__all__ = [
    "CompactionRecord",
    "HistoryCall",
    "HistoryHit",
    "HistoryRepo",
    "HistoryRow",
    "RowChanges",
    "query_words",
]
