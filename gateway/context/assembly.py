"""A session's cached rows -> chat messages, framed by the system and tail blocks.

Assembling extends what was assembled last time (`Memo`) while only appends happened, so a
round costs the new rows, not the whole history. The order is one every strict chat template
accepts: the system message first, a user message next, the per-round tail at the very end.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.config import ContextConfig
from gateway.context.budget import MESSAGE_OVERHEAD_CHARS, message_chars
from gateway.context.cache import Entry, SessionCache
from gateway.context.render import OPENING, Limits, Lod, Message, merge_user, mergeable, merged
from gateway.store.history import HistoryRow

EVERY_ROW_IS_EARLIER = 2**62  # the turn_started_seq of a /compact: no row belongs to a running turn


@dataclass
class View:
    messages: list[Message]
    chars: int


@dataclass(frozen=True)
class Memo:
    """The history assembled last time, to extend instead of assembling again: `done` entries
    rendered into `history` (`chars` long) for `turn_seq`, under `key` (what else decides how
    rows render). `before_turn` is the state before that turn's first row, where a later turn
    (a larger turn_seq) picks up, since the rows before it render alike for it."""

    key: tuple | None
    turn_seq: int
    done: int
    history: list[Message]
    chars: int
    before_turn: Memo | None = None

    def resume(self, key: tuple, turn_seq: int, entries: int) -> Memo | None:
        if key != self.key or entries < self.done:
            return None
        if turn_seq == self.turn_seq:
            return self
        if turn_seq > self.turn_seq and self.before_turn is not None:
            return self.before_turn
        return None


@dataclass(frozen=True)
class Frame:
    system: Message
    tail: Message | None
    summary: Message | None = None  # a fold's summary: the first message of the history


def summary_entry(summary: Message, seq: int) -> Entry:
    """A fold's summary as a row of the history, at the seq of the last row it replaced: a
    notice (user text, merged with a user message after it) that counts toward no tail."""
    row = HistoryRow(0, seq, "user", summary["content"], "ok", True, datetime.min.replace(tzinfo=UTC))
    return Entry(row)


def tail_start(entries: list[Entry], keep_messages: int, keep_exchanges: int) -> int:
    """Index of the first row of the pristine tail: the last N text messages and M exchanges."""
    start_text = start_exchange = len(entries)
    texts = exchanges = 0
    for index in range(len(entries) - 1, -1, -1):
        entry = entries[index]
        if entry.is_exchange and exchanges < keep_exchanges:
            exchanges += 1
            start_exchange = index
        elif entry.is_text and texts < keep_messages:
            texts += 1
            start_text = index
        if texts >= keep_messages and exchanges >= keep_exchanges:
            break
    return min(start_text, start_exchange)


class Assembler:
    def __init__(self, context: ContextConfig, limits: Limits, lods: dict[str, Lod], image_turns: int) -> None:
        self.context = context
        self.limits = limits
        self.lods = lods  # the builder's own dict: tools listed later are seen here too
        self.image_turns = image_turns

    def assemble(
        self,
        cache: SessionCache,
        entries: list[Entry],
        frame: Frame,
        turn_seq: int,
        lod_seq: int,
        cap: bool,
        *,
        memo: bool = True,
    ) -> View:
        pinned = cache.pinned if self.context.pin_first_user else None
        if frame.summary is not None:  # where the folded rows stood: after the pinned request
            entries = [summary_entry(frame.summary, cache.base_seq), *entries]
        if pinned is not None and pinned.seq <= cache.base_seq:
            entries = [Entry(pinned), *entries]
        image_seq = self._image_seq(entries)
        key = (cache.stamp, cache.base_seq, lod_seq, cap, pinned.seq if pinned else None, image_seq)
        start = Memo(key, turn_seq, 0, [], 0)
        if memo and cache.memo is not None:
            start = cache.memo.resume(key, turn_seq, len(entries)) or start
        history = list(start.history)
        chars, before_turn = self._extend(history, start.chars, entries, start.done, turn_seq, lod_seq, cap, image_seq)
        if memo:
            if before_turn is None and start.turn_seq == turn_seq:
                before_turn = start.before_turn  # crossed in an earlier build of this turn
            if before_turn is None:  # no row of this turn yet: a later turn starts from the end
                before_turn = Memo(key, turn_seq, len(entries), list(history), chars)
            cache.memo = Memo(key, turn_seq, len(entries), history, chars, before_turn)
        return View(*framed(frame, history, chars))

    def _image_seq(self, entries: list[Entry]) -> int:
        """Images go with the rows from the start of the last `attachments.image_turns` user
        turns on; older ones are left to their note (the budget stays bounded). Without
        vision, never."""
        if self.limits.image_part is None:
            return EVERY_ROW_IS_EARLIER
        seen = 0
        for entry in reversed(entries):
            row = entry.row
            if row.role == "user" and not row.synthetic:
                seen += 1
                if seen == self.image_turns:
                    return row.seq
        return 0

    def _extend(
        self,
        history: list[Message],
        chars: int,
        entries: list[Entry],
        done: int,
        turn_seq: int,
        lod_seq: int,
        cap: bool,
        image_seq: int = EVERY_ROW_IS_EARLIER,
    ) -> tuple[int, Memo | None]:
        """Append the rendered messages of entries[done:], merging consecutive user messages.
        Also returns the state just before the first row of the current turn (None when it is
        not among them): rows before it render alike in every later turn."""
        limits, lods, cap_bit = self.limits, self.lods, int(cap)
        before_turn = None
        for index in range(done, len(entries)):
            entry = entries[index]
            seq = entry.row.seq
            if seq >= turn_seq and before_turn is None and (index == 0 or entries[index - 1].row.seq < turn_seq):
                before_turn = Memo(None, turn_seq, index, list(history), chars)
            key = (seq >= image_seq) * 8 + (seq < turn_seq) * 4 + (seq < lod_seq) * 2 + cap_bit
            rendered = entry.renders.get(key) or entry.render(key, limits, lods)
            chars += rendered.chars
            messages = rendered.messages
            if messages and history and mergeable(history[-1], messages[0]):
                history[-1] = merged(history[-1], messages[0])
                chars += 2 - MESSAGE_OVERHEAD_CHARS
                messages = messages[1:]
            history.extend(messages)
        return chars, before_turn


def framed(frame: Frame, history: list[Message], chars: int) -> tuple[list[Message], int]:
    """System first, the history (from the summary of what was folded), then the tail, in an
    order every strict template accepts: a user message first, and the tail (what changes
    every round) at the very end, joined to the last user message when the history ends with one."""
    messages = [frame.system]
    chars += message_chars(frame.system)
    if history and history[0]["role"] != "user":
        messages.append(OPENING)
        chars += message_chars(OPENING)
    messages.extend(history)
    if frame.tail is not None:
        if messages[-1]["role"] == "user":
            messages[-1] = merge_user(messages[-1], frame.tail)
            chars += message_chars(frame.tail) + 2 - MESSAGE_OVERHEAD_CHARS
        else:
            messages.append(frame.tail)
            chars += message_chars(frame.tail)
    return messages, chars
