"""Full-text search over folded history: SQLite FTS5 (`compactions_fts`, kept by triggers) or a
PostgreSQL GIN index over `to_tsvector('english', summary || ' ' || folded_text)` (migration 0002).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial

from sqlalchemy import and_, false, func, or_, select, text
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import ColumnElement

from gateway.store.db import Database
from gateway.store.tables import UTCDateTime, messages, sessions

MAX_QUERY_WORDS = 16
_WORD = re.compile(r"\w+", re.UNICODE)


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


async def search_folded(db: Database, thread_key: str, query: str, *, limit: int = 5) -> list[HistoryHit]:
    """Folded spans of the thread's sessions matching `query`: all words first, then any."""
    words = query_words(query)
    if not words:
        return []
    for mode in ("all", "any"):
        hits = await _search(db, thread_key, words, mode, limit)
        if hits or len(words) == 1:
            return hits
    return []

async def _search(db: Database, thread_key: str, words: list[str], mode: str, limit: int) -> list[HistoryHit]:
    if db.is_sqlite:
        joiner = " " if mode == "all" else " OR "
        statement = _SQLITE_SEARCH
        match = joiner.join('"' + w.replace('"', "") + '"' for w in words)
    else:
        joiner = " & " if mode == "all" else " | "
        statement = _PG_SEARCH
        match = joiner.join(words)
    params = {"thread": thread_key, "match": match, "limit": limit}

    def work(conn: Connection) -> list[HistoryHit]:
        rows = conn.execute(statement, params).all()
        return [
            HistoryHit(
                r.id,
                r.session_id,
                r.first_seq,
                r.last_seq,
                r.summary,
                r.snip or "",
                r.first_at,
                r.last_at,
                r.created_at,
            )
            for r in rows
        ]

    # Ranks and cuts snippets from every matching span of the thread: off the loop.
    return await db.read(work, large=True)


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

_HEADLINE_OPTIONS = 'StartSel=«, StopSel=», MaxWords=30, MinWords=12, MaxFragments=2, FragmentDelimiter=" … "'
# The tsvector expression must match the index of migration 0002 for the index to be used.
_PG_SEARCH = text(
    f"""
    SELECT c.id, c.session_id, c.first_seq, c.last_seq, c.summary, c.created_at,
           ts_headline('english', c.folded_text, q,
                       '{_HEADLINE_OPTIONS}') AS snip,
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


# ---- earlier sessions ---------------------------------------------------------------------------
SNIPPET_CHARS = 240


@dataclass(frozen=True)
class SessionHit:
    """A message of an earlier session that matches: which session, when, who said it."""

    session_id: int
    seq: int
    role: str
    sender_name: str | None
    snippet: str
    at: datetime
    session_started: datetime


def _snippet(text: str, words: list[str]) -> str:
    flat = " ".join(text.split())
    lowered = flat.lower()
    at = min((i for i in (lowered.find(w.lower()) for w in words) if i >= 0), default=0)
    start = max(0, at - SNIPPET_CHARS // 3)
    piece = flat[start : start + SNIPPET_CHARS]
    return ("…" if start else "") + piece + ("…" if start + SNIPPET_CHARS < len(flat) else "")


async def search_sessions(
    db: Database,
    *,
    thread_key: str,
    current_session: int,
    person: tuple[str, str] | None,
    query: str,
    limit: int = 5,
) -> list[SessionHit]:
    """Messages of earlier sessions matching `query` (every word, else any), newest first.

    The sessions searched: the thread's own earlier ones, and with `person` (channel, user id:
    asked in their direct message) that person's other direct-message sessions. Never a session
    of another person's direct messages, nor of a group the thread is not.
    """
    words = query_words(query)
    if not words:
        return []
    theirs: ColumnElement[bool] = false()
    if person is not None and person[1]:
        channel, user = person
        theirs = and_(sessions.c.private.is_(True), sessions.c.started_by == user, sessions.c.source == channel)
    which = and_(sessions.c.id != current_session, or_(sessions.c.thread_key == thread_key, theirs))
    content = func.lower(messages.c.content)
    for mode in ("all", "any"):
        matches = [content.like(like_pattern(w), escape="\\") for w in words]
        query_ = (
            select(
                messages.c.session_id, messages.c.seq, messages.c.role, messages.c.sender_name, messages.c.content,
                messages.c.created_at, sessions.c.created_at.label("session_started"),
            )
            .join(sessions, sessions.c.id == messages.c.session_id)
            .where(
                which, messages.c.role.in_(("user", "assistant")), messages.c.status == "ok",
                messages.c.synthetic.is_(False), and_(*matches) if mode == "all" else or_(*matches),
            )
            .order_by(messages.c.id.desc())
            .limit(limit)
        )
        rows = await db.read(partial(_all, query_), large=True)
        if rows or len(words) == 1:
            return [
                SessionHit(r.session_id, r.seq, r.role, r.sender_name, _snippet(r.content, words), r.created_at,
                           r.session_started)
                for r in rows
            ]
    return []


def _all(statement: Select, conn: Connection) -> Sequence[Row]:
    return conn.execute(statement).all()


def like_pattern(word: str) -> str:
    """A LIKE pattern (ESCAPE '\\') for text holding `word`, in lower case."""
    escaped = word.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"
