"""Guards that stop a turn from running away: repetition, tool loops, length cut-offs.

Pure code: the turn loop feeds them what it saw and acts on the verdict (cut the stream,
add a notice and re-prompt, or end the turn with the named reason).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gateway.agent.messages import DeclaredCall, ToolResult

REPETITION_NOTICE = (
    "[repetition] Your previous output started repeating the same passage over and over and was "
    "cut; the repeated copies were removed. Continue from where the useful output ended, without "
    "repeating it."
)
TOOL_LOOP_NOTICE = (
    "[tool_loop] You have made the same tool calls with the same arguments and received the same "
    "results several rounds in a row. Repeating them will not change the outcome: use the results "
    "you already have, try a different approach, or answer the user."
)
LENGTH_NOTICE = (
    "[length] Your previous reply was cut off because it reached the output length limit. "
    "Continue exactly where it stopped, and keep the rest short."
)

RepetitionWhere = Literal["text", "reasoning", "arguments"]


@dataclass(frozen=True)
class RepetitionCut:
    """A stream collapsed into a loop: `kept` is everything before the loop plus one copy."""

    where: RepetitionWhere
    period: int  # bytes in one copy of the repeating block
    copies: int  # consecutive copies seen when the loop was detected
    kept: str
    sample: str  # one copy of the block, capped, for logs and notices
    kind: Literal["cut"] = "cut"


class RepetitionGuard:
    """Detects a block of `min_period`..`max_period` bytes repeated back to back at least
    `min_copies` times over at least `min_span` bytes, in one stream of text.

    The scan runs every `check_every` bytes of input (not per delta) and only looks at the
    tail, so its cost per delta is small and independent of how the text was chunked.
    """

    def __init__(
        self,
        where: RepetitionWhere = "text",
        *,
        min_period: int = 24,
        max_period: int = 1024,
        min_copies: int = 3,
        min_span: int = 512,
        check_every: int = 64,
    ) -> None:
        self.where: RepetitionWhere = where
        self._min_period = min_period
        self._max_period = max_period
        self._min_copies = min_copies
        self._min_span = min_span
        self._check_every = check_every
        # Enough history for min_copies of the longest period, or min_span beyond it.
        self._window = max(max_period * min_copies, min_span + max_period)
        self._buf = bytearray()
        self._checked = 0
        self.cut: RepetitionCut | None = None

    def feed(self, text: str) -> RepetitionCut | None:
        """Add streamed text; returns the cut once, when the stream has become a loop."""
        if self.cut is not None or not text:
            return None
        self._buf += text.encode("utf-8")
        while len(self._buf) - self._checked >= self._check_every:
            self._checked += self._check_every
            self.cut = self._check_at(self._checked)
            if self.cut is not None:
                return self.cut
        return None

    def _check_at(self, end: int) -> RepetitionCut | None:
        start = max(0, end - self._window)
        found = _periodic_tail(
            memoryview(self._buf)[start:end].tobytes(),
            min_period=self._min_period,
            max_period=self._max_period,
            min_copies=self._min_copies,
            min_span=self._min_span,
        )
        if found is None:
            return None
        period, copies = found
        keep_to = _loop_start(self._buf, end - copies * period, period) + period
        block = bytes(self._buf[keep_to - period:keep_to])
        return RepetitionCut(
            where=self.where,
            period=period,
            copies=copies,
            kept=self._buf[:keep_to].decode("utf-8", errors="ignore"),
            sample=block[:200].decode("utf-8", errors="ignore"),
        )


def _periodic_tail(
    data: bytes, *, min_period: int, max_period: int, min_copies: int, min_span: int
) -> tuple[int, int] | None:
    """(period, copies) of a loop that ends `data`, or None.

    Candidate periods are the distances back to earlier occurrences of the last `min_period`
    bytes; prose rarely repeats that many bytes verbatim nearby, so this is usually a single
    failed rfind. A candidate is reduced to its minimal period: a cycle shorter than
    `min_period` (blank lines, indentation, table rules) is formatting, not a loop.
    """
    n = len(data)
    if n < 2 * min_period:
        return None
    needle = data[n - min_period:]
    lowest = max(0, n - min_period - max_period)
    search_end = n - 1
    while (pos := data.rfind(needle, lowest, search_end)) >= 0:
        search_end = pos + min_period - 1
        period = n - min_period - pos
        if 2 * period > n:
            return None
        if period < min_period or data[n - 2 * period:n - period] != data[n - period:]:
            continue
        minimal = _minimal_period(data[n - period:])
        if minimal < min_period:
            return None
        copies = _count_copies(data, minimal)
        if copies >= min_copies and copies * minimal >= min_span:
            return minimal, copies
    return None


def _loop_start(buf: bytearray, start: int, period: int) -> int:
    """Walk back from `start` while the text keeps the period, so the kept copy is the first
    one (a partial copy before the counted ones belongs to the loop too)."""
    while start >= period and buf[start - period:start] == buf[start:start + period]:
        start -= period
    while start > 0 and buf[start - 1] == buf[start - 1 + period]:
        start -= 1
    return start


def _minimal_period(block: bytes) -> int:
    size = len(block)
    for d in range(1, size // 2 + 1):
        if size % d == 0 and block[:size - d] == block[d:]:
            return d
    return size


def _count_copies(data: bytes, period: int) -> int:
    n = len(data)
    last = data[n - period:]
    copies = 1
    while (copies + 1) * period <= n:
        start = n - (copies + 1) * period
        if data[start:start + period] != last:
            break
        copies += 1
    return copies


StreakVerdict = Literal["ok", "reprompt", "repetition"]


class RepetitionStreak:
    """Counts consecutive rounds cut for repetition: more than `max_cuts` ends the turn."""

    def __init__(self, max_cuts: int = 2) -> None:
        self._max_cuts = max_cuts
        self.cuts = 0

    def record(self, cut: bool) -> StreakVerdict:
        if not cut:
            self.cuts = 0
            return "ok"
        self.cuts += 1
        return "repetition" if self.cuts > self._max_cuts else "reprompt"


LoopVerdict = Literal["ok", "notice", "stop"]


class ToolLoopGuard:
    """Spots rounds that repeat the same calls, arguments AND results.

    Call ids are left out of the fingerprint; results are in it, so a poll whose result changes
    is progress, never a loop. The notice is given once per streak, at `notice_at`.
    """

    def __init__(self, notice_at: int = 5, stop_at: int = 10) -> None:
        self._notice_at = notice_at
        self._stop_at = stop_at
        self._last: str | None = None
        self.streak = 0

    def record(self, calls: Sequence[DeclaredCall], results: Sequence[ToolResult]) -> LoopVerdict:
        if not calls:
            self._last, self.streak = None, 0
            return "ok"
        fingerprint = round_fingerprint(calls, results)
        self.streak = self.streak + 1 if fingerprint == self._last else 1
        self._last = fingerprint
        if self.streak >= self._stop_at:
            return "stop"
        return "notice" if self.streak == self._notice_at else "ok"


def round_fingerprint(calls: Sequence[DeclaredCall], results: Sequence[ToolResult]) -> str:
    """A digest of (name, canonical arguments, result text) per call, in declared order."""
    text_by_id = {r.call_id: r.text for r in results}
    parts = [[c.name, canonical_arguments(c.arguments), text_by_id.get(c.id)] for c in calls]
    encoded = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(encoded.encode("utf-8")).hexdigest()


def canonical_arguments(raw: str) -> str:
    """Key order and whitespace do not make two calls different."""
    try:
        value = json.loads(raw)
    except ValueError:
        return raw.strip()
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


LengthVerdict = Literal["ok", "reprompt", "overflow"]


class LengthGuard:
    """A reply cut by the output limit is re-prompted at most `max_reprompts` times in a row."""

    def __init__(self, max_reprompts: int = 2) -> None:
        self._max = max_reprompts
        self.cuts = 0

    def record(self, finish_reason: str | None) -> LengthVerdict:
        if finish_reason != "length":
            self.cuts = 0
            return "ok"
        self.cuts += 1
        return "overflow" if self.cuts > self._max else "reprompt"
