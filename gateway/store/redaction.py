"""Taking words out of the rows the gateway keeps: what forgetting a memory entry does to its
copies, and what erasing a person does to their words (gateway/store/memory.py, erasure.py).

A text is copied wherever it was seen: the history of the conversations it came up in (messages,
tool calls and their results, folded history and its search index, scratchpads, sub-agents'
tasks), their runs' events, the inbox and outbox rows and prompts of their threads, and their
rows of the audit trail. `Places` names those conversations; `find_copies` reads them for the
text (a LIKE per column: it may read much, so callers run it as a large read), and
`redact_copies` rewrites the rows found, by id, in the caller's write. Only the text is
replaced; a row that says something else as well keeps the rest. Rows of conversations outside
the places are never touched: the same words said elsewhere, by someone else, are theirs.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, Table, Text, and_, cast, false, or_, select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import ColumnElement

from gateway.store.history_search import like_pattern
from gateway.store.tables import (
    audit,
    compactions,
    delegations,
    inbox,
    messages,
    outbox,
    prompts,
    run_events,
    runs,
    schedules,
    sessions,
    tool_calls,
)

FORGOTTEN = "[forgotten]"
CHUNK = 500  # ids per IN list


@dataclass(frozen=True)
class Places:
    """The conversations (sessions) and threads whose rows may hold a copy."""

    sessions: tuple[int, ...]
    threads: tuple[str, ...]


@dataclass(frozen=True)
class Spot:
    """A column that may hold a copy, and how its rows belong to a place."""

    table: Table
    column: str
    link: str  # "session": the column named by `link_column` holds a session id; "run"; "thread"
    link_column: str

    @property
    def is_json(self) -> bool:
        return isinstance(self.table.c[self.column].type, JSON)


SPOTS: tuple[Spot, ...] = (
    Spot(messages, "content", "session", "session_id"),
    Spot(messages, "reasoning", "session", "session_id"),
    Spot(tool_calls, "arguments", "session", "session_id"),
    Spot(tool_calls, "result", "session", "session_id"),
    Spot(tool_calls, "note", "session", "session_id"),
    Spot(compactions, "summary", "session", "session_id"),
    Spot(compactions, "folded_text", "session", "session_id"),
    Spot(sessions, "notes", "session", "id"),
    Spot(delegations, "prompt", "session", "parent_session_id"),
    Spot(delegations, "result", "session", "parent_session_id"),
    Spot(prompts, "payload", "session", "session_id"),
    Spot(prompts, "answer", "session", "session_id"),
    Spot(run_events, "payload", "run", "run_id"),
    Spot(inbox, "payload", "thread", "thread_key"),
    Spot(outbox, "payload", "thread", "thread_key"),
    Spot(audit, "arguments", "thread", "thread_key"),
    Spot(audit, "detail", "thread", "thread_key"),
)


def variants(words: str) -> list[str]:
    """`words` as they may be stored: as written, inside a JSON string (with or without escaped
    non-ASCII), and inside a JSON string that is itself in JSON (a tool call's arguments in a
    run event); longest first, so a replacement never leaves half an escape behind."""
    forms = {words}
    for ascii_only in (True, False):
        once = json.dumps(words, ensure_ascii=ascii_only)[1:-1]
        forms.add(once)
        forms.add(json.dumps(once, ensure_ascii=ascii_only)[1:-1])
    return sorted((f for f in forms if f.strip()), key=len, reverse=True)


class Scrubber:
    """Replaces every form of some texts, in any case, in strings and JSON values."""

    def __init__(self, texts: Iterable[str], replacement: str = FORGOTTEN):
        forms = sorted({f for t in texts if t.strip() for f in variants(t)}, key=len, reverse=True)
        self.forms = forms
        self.replacement = replacement
        self._pattern = re.compile("|".join(re.escape(f) for f in forms), re.IGNORECASE) if forms else None

    def text(self, value: str) -> str:
        return self._pattern.sub(self.replacement, value) if self._pattern is not None else value

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        return value


# ---- where a memory owner's entries are seen --------------------------------------------------


def places_of(conn: Connection, owner: str, also: Iterable[int | None] = ()) -> Places:
    """The conversations a memory owner's entries can have been seen in: a chat's threads; a
    person's direct messages and the conversations they spoke in (their memory is read only in
    their own turns); a job's runs. `also`: sessions to add (where an entry was saved)."""
    kind, _, rest = owner.partition(":")
    where: ColumnElement[bool] = false()
    if kind == "chat":
        where = sessions.c.thread_key.like(_prefix(rest + ":"), escape="\\")
    elif kind == "person":
        channel, _, user = rest.partition(":")
        spoke = select(messages.c.session_id).where(messages.c.sender_id == user, messages.c.role == "user")
        theirs = or_(and_(sessions.c.private.is_(True), sessions.c.started_by == user), sessions.c.id.in_(spoke))
        where = and_(sessions.c.thread_key.like(_prefix(channel + ":"), escape="\\"), theirs)
    elif kind == "job":
        where = sessions.c.schedule_id.in_(select(schedules.c.id).where(schedules.c.name == rest))
    extra = [i for i in also if i is not None]
    if extra:
        where = or_(where, sessions.c.id.in_(extra))
    return with_children(conn, conn.execute(select(sessions.c.id, sessions.c.thread_key).where(where)).all())


def with_children(conn: Connection, rows: Sequence[Any]) -> Places:
    """The sessions of `rows` (id, thread key) and their sub-agents' sessions, with their threads."""
    ids = {int(r[0]) for r in rows}
    threads = {str(r[1]) for r in rows}
    frontier = set(ids)
    while frontier:
        children = select(sessions.c.id, sessions.c.thread_key).where(
            sessions.c.id.in_(select(delegations.c.child_session_id).where(delegations.c.parent_session_id.in_(frontier)))
        )
        found = [r for r in conn.execute(children).all() if int(r[0]) not in ids]
        frontier = {int(r[0]) for r in found}
        ids |= frontier
        threads |= {str(r[1]) for r in found}
    return Places(tuple(sorted(ids)), tuple(sorted(threads)))


def _prefix(value: str) -> str:
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


# ---- finding and rewriting copies -------------------------------------------------------------


@dataclass(frozen=True)
class Copy:
    spot: Spot
    row_id: int


def find_copies(conn: Connection, places: Places, texts: Sequence[str]) -> list[Copy]:
    """The rows of `places` whose columns hold one of `texts` (any case, any stored form)."""
    patterns = [like_pattern(form) for t in texts if t.strip() for form in variants(t)]
    if not patterns or not places.sessions and not places.threads:
        return []
    found: list[Copy] = []
    for spot in SPOTS:
        column: ColumnElement[Any] = spot.table.c[spot.column]
        searched = cast(column, Text) if spot.is_json else column
        holds = or_(*(searched.ilike(p, escape="\\") for p in patterns))
        for chunk in _links(spot, places):
            query = select(spot.table.c.id).where(_linked(spot, chunk), holds)
            found += [Copy(spot, int(i)) for i in conn.execute(query).scalars()]
    return found


def _links(spot: Spot, places: Places) -> list[list[Any]]:
    values: Sequence[Any] = places.threads if spot.link == "thread" else places.sessions
    return [list(values[i : i + CHUNK]) for i in range(0, len(values), CHUNK)]


def _linked(spot: Spot, chunk: list[Any]) -> ColumnElement[bool]:
    if spot.link == "run":
        return spot.table.c.run_id.in_(select(runs.c.id).where(runs.c.session_id.in_(chunk)))
    return spot.table.c[spot.link_column].in_(chunk)


def redact_copies(conn: Connection, copies: Sequence[Copy], scrubber: Scrubber) -> dict[str, int]:
    """Each copy's column with the texts replaced; rows changed per table."""
    changed: dict[str, set[int]] = {}
    for copy in copies:
        table, name = copy.spot.table, copy.spot.column
        current = conn.execute(select(table.c[name]).where(table.c.id == copy.row_id)).scalar()
        if current is None:
            continue
        cleaned = scrubber.value(current)
        if cleaned != current:
            conn.execute(update(table).where(table.c.id == copy.row_id).values({name: cleaned}))
            changed.setdefault(table.name, set()).add(copy.row_id)
    if "compactions" in changed:
        purge_search_index(conn)
    return {name: len(ids) for name, ids in changed.items()}


def purge_search_index(conn: Connection) -> None:
    """SQLite's full-text index keeps a changed row's old words in older segments until they
    are merged: merged now, so history_search cannot find them and their pages are freed (and
    zeroed: secure_delete). PostgreSQL's GIN index drops them when VACUUM reclaims the old rows."""
    if conn.dialect.name == "sqlite":
        conn.execute(text("INSERT INTO compactions_fts(compactions_fts) VALUES ('optimize')"))
