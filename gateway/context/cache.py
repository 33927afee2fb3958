"""What a builder remembers about a session between rounds, and the incremental reload.

A round reads only what may have changed: rows after the last one seen, the previous and the
current turn (their calls are still being answered), and rows whose calls finished or failed
since the last read (a cheap probe). Rendered rows are cached per `Mode`, so a round renders
only new rows. Rows before the latest compaction marker are never read again.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from gateway.context.render import MODES, Limits, Lod, RenderedRow, render_row
from gateway.events import utcnow
from gateway.store.history import CompactionRecord, HistoryRepo, HistoryRow

CLOCK_MARGIN = timedelta(seconds=5)  # finished_at stamps of other writers may lag ours a little
# Kept while the sessions are in use, least recently used dropped first. Bounded by sessions and
# by the rows they hold together: 64 sessions made every build cold once more threads than that
# were in flight (each turn read its whole history again); rows bound the memory instead.
MAX_SESSIONS = 4096
MAX_ROWS = 100_000


@dataclass
class Entry:
    row: HistoryRow
    renders: dict[int, RenderedRow] = field(default_factory=dict)  # by mode key, see render.MODES

    def render(self, mode_key: int, limits: Limits, lods: dict[str, Lod]) -> RenderedRow:
        rendered = self.renders.get(mode_key)
        if rendered is None:
            rendered = self.renders[mode_key] = render_row(self.row, MODES[mode_key], limits, lods)
        return rendered

    @property
    def seq(self) -> int:
        return self.row.seq

    @property
    def is_exchange(self) -> bool:
        return self.row.role == "assistant" and bool(self.row.calls)

    @property
    def is_text(self) -> bool:
        return not self.is_exchange and not self.row.synthetic and self.row.role in ("user", "assistant")


@dataclass
class SessionCache:
    session_id: int
    marker: CompactionRecord | None = None
    entries: dict[int, Entry] = field(default_factory=dict)  # seq -> entry, failed rows included
    order: list[int] = field(default_factory=list)
    max_seq: int = 0
    turn_seq: int = 0  # turn_started_seq of the previous build
    loaded_at: datetime | None = None
    pinned: HistoryRow | None = None
    pinned_loaded: bool = False
    lod_seq: int = 0  # tool results of rows before this seq are stubbed (moves forward only)
    failed: set[int] = field(default_factory=set)  # seqs of cached rows that are not shown
    stamp: int = 0  # bumped by anything but an append
    memo: Any = None  # the last assembled history (assembly.Memo), extended while only appends happen
    _visible: list[Entry] | None = None

    @property
    def base_seq(self) -> int:
        return self.marker.last_seq if self.marker else 0

    @property
    def summary(self) -> str | None:
        """The summary of what was folded, shown in the system block."""
        return self.marker.summary if self.marker else None

    def visible(self) -> list[Entry]:
        if self._visible is None:
            self._visible = [e for seq in self.order if (e := self.entries[seq]).row.status == "ok"]
        return self._visible

    def changed(self) -> None:
        """Something other than an append: cached assemblies are no longer valid."""
        self.stamp += 1
        self._visible = None

    def put(self, rows: list[HistoryRow]) -> None:
        for row in rows:
            if row.seq <= self.base_seq:
                continue
            known = self.entries.get(row.seq)
            if known is not None and known.row == row:
                continue  # unchanged: keep its renders
            self.entries[row.seq] = entry = Entry(row)
            if row.status != "ok":
                self.failed.add(row.seq)
            else:
                self.failed.discard(row.seq)
            if known is None and (not self.order or row.seq > self.order[-1]):
                self.order.append(row.seq)
                if self._visible is not None and row.status == "ok":
                    self._visible.append(entry)
            else:
                if known is None:
                    self.order.append(row.seq)
                    self.order.sort()
                self.changed()
            self.max_seq = max(self.max_seq, row.seq)

    def mark_failed(self, seqs: set[int]) -> None:
        for seq in seqs:
            self.entries[seq] = Entry(replace(self.entries[seq].row, status="failed"))
        self.failed |= seqs
        self.changed()
        if self.pinned is not None and self.pinned.seq in seqs:
            self.pinned, self.pinned_loaded = None, False

    def advance(self, marker: CompactionRecord) -> None:
        """A fold we wrote: forget the folded rows, keep the rest rendered."""
        self.marker = marker
        for seq in [s for s in self.order if s <= marker.last_seq]:
            del self.entries[seq]
        self.order = [s for s in self.order if s > marker.last_seq]
        self.failed = {s for s in self.failed if s > marker.last_seq}
        self.lod_seq = 0
        self.changed()

    def reset(self, marker: CompactionRecord | None) -> None:
        self.marker = marker
        self.entries.clear()
        self.order.clear()
        self.failed.clear()
        self.max_seq = self.base_seq
        self.loaded_at = None
        self.lod_seq = 0
        self.changed()


class Caches:
    """Session caches, least recently used dropped first, beyond `limit` sessions or `max_rows`
    rows held together (a session's rows as counted when it was last taken)."""

    def __init__(self, limit: int = MAX_SESSIONS, max_rows: int = MAX_ROWS) -> None:
        self._limit = limit
        self._max_rows = max_rows
        self._caches: OrderedDict[int, SessionCache] = OrderedDict()
        self._sizes: dict[int, int] = {}
        self._rows = 0

    def get(self, session_id: int) -> SessionCache:
        cache = self._caches.pop(session_id, None) or SessionCache(session_id)
        self._caches[session_id] = cache
        size = len(cache.entries)
        self._rows += size - self._sizes.get(session_id, 0)
        self._sizes[session_id] = size
        while len(self._caches) > self._limit or (self._rows > self._max_rows and len(self._caches) > 1):
            oldest, _ = self._caches.popitem(last=False)
            self._rows -= self._sizes.pop(oldest, 0)
        return cache

    def drop(self, session_id: int) -> None:
        self._caches.pop(session_id, None)
        self._rows -= self._sizes.pop(session_id, 0)


async def refresh(cache: SessionCache, repo: HistoryRepo, turn_started_seq: int) -> None:
    """Bring the cache up to date with the database at the cost of what changed."""
    started = utcnow()
    if cache.loaded_at is None:
        await _load(cache, repo, await repo.latest_compaction(cache.session_id))
    else:
        window = min(turn_started_seq, cache.turn_seq or turn_started_seq, cache.max_seq + 1)
        reads = await repo.round_reads(
            cache.session_id,
            after_seq=cache.base_seq,
            before_seq=window,
            since=cache.loaded_at - CLOCK_MARGIN,
            tail_after=window - 1,
        )
        if (reads.marker.id if reads.marker else None) != (cache.marker.id if cache.marker else None):
            await _load(cache, repo, reads.marker)  # folded elsewhere: start again from the new marker
        else:
            known_failed = {s for s in cache.failed if s < window}
            stale = set(reads.changes.touched) | (set(reads.changes.failed) ^ known_failed)
            if stale:
                cache.put(await repo.rows(cache.session_id, seqs=stale))
            cache.put(reads.tail)
    cache.turn_seq = turn_started_seq
    cache.loaded_at = started
    if not cache.pinned_loaded:
        cache.pinned = await repo.first_user_row(cache.session_id)
        cache.pinned_loaded = cache.pinned is not None


async def _load(cache: SessionCache, repo: HistoryRepo, marker: CompactionRecord | None) -> None:
    """Everything after the latest compaction marker (a first build, or after a fold elsewhere)."""
    cache.reset(marker)
    cache.put(await repo.rows(cache.session_id, after_seq=cache.base_seq))
