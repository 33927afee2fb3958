"""Memory entries (what the agent saved across sessions) and who shares theirs with groups.

Every change is written with its row of the audit trail in the same transaction. Reads take
the owners to read as an explicit list: which owners a session may read is decided once, in
gateway/memory/scope.py, never here and never by the model.

Forgetting takes an entry's text out of every copy kept in the conversations its owner's
memory is seen in (gateway/store/redaction.py), in the write that deletes it; the database's
freed pages are zeroed (SQLite secure_delete) and its WAL emptied after.
"""

from __future__ import annotations

import builtins  # the repository has a `list` method, which hides the type in its signatures
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial

from sqlalchemy import and_, delete, func, insert, or_, select, update
from sqlalchemy.engine import Connection, Row
from sqlalchemy.sql import Select
from sqlalchemy.sql.elements import ColumnElement

from gateway.events import utcnow
from gateway.store.audit import AuditEntry, AuditRepo
from gateway.store.base import Repo, to_record
from gateway.store.history_search import like_pattern
from gateway.store.redaction import FORGOTTEN, Copy, Places, Scrubber, find_copies, places_of, redact_copies
from gateway.store.tables import audit, memories, memory_sharing, tool_calls


@dataclass(frozen=True)
class MemoryRecord:
    id: int
    owner: str
    text: str
    topic: str | None
    created_by: str | None
    session_id: int | None
    uses: int
    created_at: datetime
    last_used_at: datetime
    # "words" (the saver's own), else the untrusted kinds its conversation held, comma-separated;
    # "unknown": saved before it was recorded (gateway/memory/provenance.py)
    source: str = "unknown"
    author_name: str | None = None
    approved_by: str | None = None  # who approved a save from untrusted content


@dataclass(frozen=True)
class Saved:
    record: MemoryRecord
    existed: bool  # the same text was saved for this owner already: nothing was added


@dataclass(frozen=True)
class OwnerSummary:
    """One owner's memory as the console lists it."""

    owner: str
    entries: int
    last_used_at: datetime
    shared: bool


MIN_SEARCHED = 8  # characters: a shorter entry is taken out of its save's call only, not searched for
FORGOTTEN_SAVE = {"text": FORGOTTEN}


class MemoryFull(Exception):
    """The owner has `max_entries` entries already."""


def _matching(words: Sequence[str], mode: str) -> ColumnElement[bool]:
    text = func.lower(memories.c.text + " " + func.coalesce(memories.c.topic, ""))
    conditions = [text.like(like_pattern(w), escape="\\") for w in words]
    return and_(*conditions) if mode == "all" else or_(*conditions)


def _with_detail(entry: AuditEntry | None, **detail: object) -> AuditEntry | None:
    return None if entry is None else replace(entry, detail={**entry.detail, **detail})


class MemoryRepo(Repo):
    # ---- writes ------------------------------------------------------------------------------
    async def save(
        self,
        owner: str,
        text: str,
        *,
        topic: str | None = None,
        created_by: str | None = None,
        session_id: int | None = None,
        source: str = "unknown",
        author_name: str | None = None,
        approved_by: str | None = None,
        max_entries: int = 200,
        audit: AuditEntry | None = None,
    ) -> Saved:
        """A new entry (or the same text saved before, whose use it counts); raises MemoryFull."""
        now = utcnow()

        def work(conn: Connection) -> Saved:
            same = conn.execute(select(memories).where(memories.c.owner == owner, memories.c.text == text)).first()
            if same is not None:
                conn.execute(update(memories).where(memories.c.id == same.id).values(last_used_at=now))
                return Saved(replace(to_record(MemoryRecord, same), last_used_at=now), True)
            count = conn.execute(select(func.count()).select_from(memories).where(memories.c.owner == owner)).scalar()
            if (count or 0) >= max_entries:
                raise MemoryFull(f"{count} entries")
            values = dict(
                owner=owner, text=text, topic=topic, created_by=created_by, session_id=session_id, uses=0,
                created_at=now, last_used_at=now, source=source, author_name=author_name, approved_by=approved_by,
            )
            memory_id = conn.execute(insert(memories).values(**values).returning(memories.c.id)).scalar_one()
            entry = _with_detail(audit, memory_id=memory_id, owner=owner, topic=topic, source=source)
            if entry is not None:
                AuditRepo.record_in(conn, entry)
            return Saved(MemoryRecord(id=memory_id, **values), False)  # type: ignore[arg-type]

        return await self.db.write(work)

    async def forget(self, owner: str, ids: Sequence[int], *, audit: AuditEntry | None = None) -> list[MemoryRecord]:
        """Delete those of `ids` that are `owner`'s (any other id is left alone), and their
        texts from every copy in the conversations the owner's memory is seen in; the deleted."""
        if not ids:
            return []
        mine = and_(memories.c.owner == owner, memories.c.id.in_(list(ids)))
        return await self._forget_where(owner, mine, audit, lambda rows: {"memory_ids": [r.id for r in rows]})

    async def clear(self, owner: str, *, audit: AuditEntry | None = None) -> int:
        """Delete every entry of `owner` (and their copies, as `forget`); how many there were."""
        gone = await self._forget_where(
            owner, memories.c.owner == owner, audit, lambda rows: {"deleted": len(rows)}, always_audit=True
        )
        return len(gone)

    async def _forget_where(
        self,
        owner: str,
        which: ColumnElement[bool],
        audit: AuditEntry | None,
        detail: Callable[[builtins.list[MemoryRecord]], dict[str, object]],
        *,
        always_audit: bool = False,
    ) -> builtins.list[MemoryRecord]:
        def find(conn: Connection) -> tuple[builtins.list[MemoryRecord], Places, builtins.list[Copy]]:
            rows = [to_record(MemoryRecord, r) for r in conn.execute(select(memories).where(which)).all()]
            places = places_of(conn, owner, [r.session_id for r in rows])
            return rows, places, find_copies(conn, places, searchable(r.text for r in rows))

        found, places, copies = await self.db.read(find, large=True)  # whole tables may be read

        def work(conn: Connection) -> builtins.list[MemoryRecord]:
            # The entries deleted now (one forgotten meanwhile is not forgotten twice).
            rows = [to_record(MemoryRecord, r) for r in conn.execute(select(memories).where(which)).all()]
            if rows:
                conn.execute(delete(memories).where(memories.c.id.in_([r.id for r in rows])))
                forget_copies(conn, rows, places, copies, {r.text for r in found})
            entry = _with_detail(audit, owner=owner, **detail(rows))
            if entry is not None and (rows or always_audit):
                AuditRepo.record_in(conn, entry)
            return rows

        gone = await self.db.write(work)
        if found or gone:
            await self.db.flush_erased()
        return gone

    async def touch(self, ids: Sequence[int], *, found: bool = False) -> None:
        """Entries were shown at a session's start, or (`found`) returned by a search."""
        if not ids:
            return
        values: dict[str, object] = {"last_used_at": utcnow()}
        if found:
            values["uses"] = memories.c.uses + 1
        statement = update(memories).where(memories.c.id.in_(list(ids))).values(**values)
        await self.db.write(lambda conn: conn.execute(statement))

    async def set_shared(self, owner: str, shared: bool, *, audit: AuditEntry | None = None) -> None:
        """Whether `owner` (a person) lets their memory be read in the groups they speak in."""

        def work(conn: Connection) -> None:
            now = utcnow()
            found = conn.execute(
                update(memory_sharing).where(memory_sharing.c.owner == owner).values(shared=shared, updated_at=now)
            ).rowcount
            if not found:
                conn.execute(insert(memory_sharing).values(owner=owner, shared=shared, updated_at=now))
            entry = _with_detail(audit, owner=owner, shared=shared)
            if entry is not None:
                AuditRepo.record_in(conn, entry)

        await self.db.write(work)

    async def prune(self, days: float, *, batch: int = 1000) -> int:
        """Delete entries neither saved, shown nor found for `days` (0: none)."""
        if days <= 0:
            return 0
        cutoff = utcnow() - timedelta(days=days)
        ids = select(memories.c.id).where(memories.c.last_used_at < cutoff).limit(batch).scalar_subquery()
        statement = delete(memories).where(memories.c.id.in_(ids))
        total = 0
        while True:
            deleted = await self.db.write(lambda conn: int(conn.execute(statement).rowcount or 0))
            total += deleted
            if deleted < batch:
                return total

    # ---- reads -------------------------------------------------------------------------------
    async def get(self, memory_id: int) -> MemoryRecord | None:
        query = select(memories).where(memories.c.id == memory_id)
        row = await self.db.read(lambda conn: conn.execute(query).first())
        return to_record(MemoryRecord, row) if row else None

    async def list(self, owners: Sequence[str], *, limit: int = 1000) -> builtins.list[MemoryRecord]:
        """The owners' entries, oldest first (the order /memory numbers them in)."""
        if not owners:
            return []
        query = select(memories).where(memories.c.owner.in_(list(owners))).order_by(memories.c.id).limit(limit)
        rows = await self.db.read(lambda conn: conn.execute(query).all())
        return [to_record(MemoryRecord, r) for r in rows]

    async def ranked(
        self, owners: Sequence[str], *, saved_before: datetime | None = None, limit: int = 500
    ) -> builtins.list[MemoryRecord]:
        """The owners' entries most recently used (or saved) first, then the most used: what a
        session's start shows first. `saved_before`: only entries saved before then."""
        if not owners:
            return []
        query = select(memories).where(memories.c.owner.in_(list(owners)))
        if saved_before is not None:
            query = query.where(memories.c.created_at <= saved_before)
        query = query.order_by(memories.c.last_used_at.desc(), memories.c.uses.desc(), memories.c.id.desc())
        rows = await self.db.read(lambda conn: conn.execute(query.limit(limit)).all())
        return [to_record(MemoryRecord, r) for r in rows]

    async def all_present(self, ids: Sequence[int]) -> bool:
        """Whether every one of `ids` is still an entry (none was forgotten): one read of the
        ids themselves, however many entries there are."""
        if not ids:
            return True
        query = select(func.count()).select_from(memories).where(memories.c.id.in_(list(ids)))
        return await self.db.read(lambda conn: conn.execute(query).scalar()) == len(set(ids))

    async def search(
        self, owners: Sequence[str], words: Sequence[str], *, limit: int = 10
    ) -> builtins.list[MemoryRecord]:
        """Entries of the owners holding every word (text or topic, any case), else any word."""
        if not owners or not words:
            return []
        for mode in ("all", "any"):
            query = (
                select(memories)
                .where(memories.c.owner.in_(list(owners)), _matching(words, mode))
                .order_by(memories.c.uses.desc(), memories.c.id.desc())
                .limit(limit)
            )
            rows = await self.db.read(partial(_all, query))
            if rows or len(words) == 1:
                return [to_record(MemoryRecord, r) for r in rows]
        return []

    async def shared(self, owner: str) -> bool:
        query = select(memory_sharing.c.shared).where(memory_sharing.c.owner == owner)
        return bool(await self.db.read(lambda conn: conn.execute(query).scalar()))

    async def owners(self, *, limit: int = 500) -> builtins.list[OwnerSummary]:
        """Every owner with entries, the most recently used first (the console's list)."""
        query = (
            select(memories.c.owner, func.count().label("entries"), func.max(memories.c.last_used_at).label("last"))
            .group_by(memories.c.owner)
            .order_by(func.max(memories.c.last_used_at).desc())
            .limit(limit)
        )

        def work(conn: Connection) -> builtins.list[OwnerSummary]:
            rows = conn.execute(query).all()
            sharing = select(memory_sharing.c.owner).where(memory_sharing.c.shared.is_(True))
            shared = set(conn.execute(sharing).scalars())
            return [OwnerSummary(r.owner, int(r.entries), _aware(r.last), r.owner in shared) for r in rows]

        return await self.db.read(work)


def forget_copies(
    conn: Connection, rows: Sequence[MemoryRecord], places: Places, copies: Sequence[Copy], searched: set[str]
) -> None:
    """In the write that deletes `rows`: the memory_save calls that saved them (arguments, and
    their audit rows) and the topics their saves' audit rows name, then their texts out of the
    copies found (texts long enough to search for: a short one would match unrelated words)."""
    texts = {r.text for r in rows}
    _forget_saves(conn, places, texts)
    ids = {r.id for r in rows}
    saves = select(audit.c.id, audit.c.detail).where(  # by tool: indexed
        audit.c.tool == "memory_save", audit.c.kind == "memory", audit.c.action == "save"
    )
    for row_id, row_detail in conn.execute(saves).all():
        if isinstance(row_detail, dict) and row_detail.get("memory_id") in ids and row_detail.get("topic"):
            conn.execute(update(audit).where(audit.c.id == row_id).values(detail={**row_detail, "topic": FORGOTTEN}))
    long_enough = searchable(texts)
    unsearched = [t for t in long_enough if t not in searched]  # saved between the search and this write
    redact_copies(conn, [*copies, *find_copies(conn, places, unsearched)], Scrubber(long_enough))


def searchable(texts: Iterable[str]) -> list[str]:
    return [t for t in texts if len(t.strip()) >= MIN_SEARCHED]


def _forget_saves(conn: Connection, places: Places, texts: set[str]) -> None:
    """The memory_save calls whose text is one of `texts`: their arguments, in the history and in
    the audit trail, become {"text": "[forgotten]"}."""
    calls = select(tool_calls.c.id, tool_calls.c.arguments).where(
        tool_calls.c.name == "memory_save", tool_calls.c.session_id.in_(list(places.sessions))
    )
    ids = [row_id for row_id, arguments in conn.execute(calls).all() if _saved_text(arguments) in texts]
    if ids:
        conn.execute(update(tool_calls).where(tool_calls.c.id.in_(ids)).values(arguments=json.dumps(FORGOTTEN_SAVE)))
    trail = select(audit.c.id, audit.c.arguments).where(
        audit.c.tool == "memory_save", audit.c.thread_key.in_(list(places.threads))
    )
    rows = [row_id for row_id, arguments in conn.execute(trail).all() if _saved_text(arguments) in texts]
    if rows:
        conn.execute(update(audit).where(audit.c.id.in_(rows)).values(arguments=FORGOTTEN_SAVE))


def _saved_text(arguments: object) -> str | None:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    text = arguments.get("text") if isinstance(arguments, dict) else None
    return text.strip() if isinstance(text, str) else None


def _all(statement: Select, conn: Connection) -> Sequence[Row]:
    return conn.execute(statement).all()


def _aware(value: datetime) -> datetime:
    """max() of a UTCDateTime column comes back without its type's processing on SQLite."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
