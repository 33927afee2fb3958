"""Streamed chunks -> complete rounds, and tool results paired with the calls that asked for them.

A round is one assistant output (text, reasoning, tool calls) plus exactly one result per
declared call, in declared order. Whatever happens (cancel, error, new output while calls are
open), a flushed round is always paired: missing results become `[placeholder] <reason>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from gateway.agent.guards import RepetitionCut, RepetitionGuard
from gateway.llm.events import (
    Finish,
    ModelInfo,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    Usage,
)

PlaceholderReason = Literal["canceled", "interrupted", "superseded"]
PLACEHOLDER_PREFIX = "[placeholder] "
PERSIST_TIMEOUT_S = 10.0  # bound on persisting one round; persistence outlives a cancel
FAILED_PREFIX = "[failed] "


@dataclass(frozen=True)
class DeclaredCall:
    id: str
    name: str
    arguments: str  # raw text as streamed; checked later by gateway.agent.arguments


@dataclass(frozen=True)
class AssistantDraft:
    """What has streamed so far (arguments may be partial); for live display."""

    text: str
    reasoning: str
    calls: tuple[DeclaredCall, ...]


@dataclass(frozen=True)
class Round:
    """The assistant's side of one LLM call, complete."""

    text: str
    reasoning: str
    calls: tuple[DeclaredCall, ...]
    finish_reason: str | None  # stop | tool_calls | length | content_filter; None if cut
    usage: Usage | None = None
    repetition: RepetitionCut | None = None
    model: str = ""  # the configured model that answered (from the stream's ModelInfo)

    @property
    def cut_off(self) -> bool:
        """The output limit ended the reply (a call's arguments may be incomplete)."""
        return self.finish_reason == "length"


@dataclass
class _CallSlot:
    index: int
    seq: int
    id: str = ""
    name: str = ""
    parts: list[str] = field(default_factory=list)
    guard: RepetitionGuard | None = None


class RoundBuilder:
    """Aggregates one LLM stream into a `Round`.

    Tool-call fragments are grouped by index and their argument fragments concatenated. Copes
    with providers that repeat id/name on every fragment, leave gaps in the indexes, or reuse an
    index for a new call (a different id). Missing or clashing ids are synthesised as
    `{id_prefix}_{ordinal}`, so the caller makes them unique across a turn through the prefix.
    With `guard_repetition`, every channel is watched and `feed` returns the cut once; the
    finished round then holds the trimmed text and drops the looping call and those after it.
    """

    def __init__(self, *, id_prefix: str = "call", guard_repetition: bool = True) -> None:
        self._id_prefix = id_prefix
        self._guard = guard_repetition
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._slots: list[_CallSlot] = []
        self._slot_by_index: dict[int, _CallSlot] = {}
        self._finish: str | None = None
        self._usage: Usage | None = None
        self._model = ""
        self._text_guard = RepetitionGuard("text") if guard_repetition else None
        self._reasoning_guard = RepetitionGuard("reasoning") if guard_repetition else None
        self._cut: RepetitionCut | None = None
        self._cut_slot: _CallSlot | None = None

    @property
    def cut(self) -> RepetitionCut | None:
        return self._cut

    def feed(self, event: StreamEvent) -> RepetitionCut | None:
        """Add one stream event; returns a repetition cut once (the caller stops the stream)."""
        if isinstance(event, Usage):
            self._usage = event
            return None
        if isinstance(event, ModelInfo):
            self._model = event.model
            return None
        if self._cut is not None:
            return None  # the stream is being abandoned; nothing after the loop is kept
        if isinstance(event, TextDelta):
            self._text.append(event.text)
            return self._watch(self._text_guard, event.text)
        if isinstance(event, ReasoningDelta):
            self._reasoning.append(event.text)
            return self._watch(self._reasoning_guard, event.text)
        if isinstance(event, ToolCallDelta):
            slot = self._slot_for(event)
            slot.parts.append(event.arguments)
            cut = self._watch(slot.guard, event.arguments)
            if cut is not None:
                self._cut_slot = slot
            return cut
        if isinstance(event, Finish):
            self._finish = event.reason
        return None

    def text_so_far(self) -> str:
        return "".join(self._text)

    def draft(self) -> AssistantDraft:
        return AssistantDraft("".join(self._text), "".join(self._reasoning), self._calls())

    def finish(self) -> Round:
        text, reasoning, calls = "".join(self._text), "".join(self._reasoning), self._calls()
        cut = self._cut
        if cut is not None and cut.where == "text":
            text = cut.kept
        elif cut is not None and cut.where == "reasoning":
            reasoning = cut.kept
        elif cut is not None and self._cut_slot is not None:
            calls = calls[: self._ordered_slots().index(self._cut_slot)]
        finish = None if cut is not None else self._finish
        return Round(text, reasoning, calls, finish, self._usage, cut, self._model)

    def _watch(self, guard: RepetitionGuard | None, text: str) -> RepetitionCut | None:
        if guard is None:
            return None
        self._cut = guard.feed(text)
        return self._cut

    def _slot_for(self, event: ToolCallDelta) -> _CallSlot:
        slot = self._slot_by_index.get(event.index)
        if slot is None or (event.id and slot.id and event.id != slot.id):
            guard = RepetitionGuard("arguments") if self._guard else None
            slot = _CallSlot(event.index, len(self._slots), guard=guard)
            self._slots.append(slot)
            self._slot_by_index[event.index] = slot
        if event.id and not slot.id:
            slot.id = event.id
        if event.name and event.name != slot.name:
            # A repeated name is ignored; a different one is a further fragment of it.
            slot.name += event.name
        return slot

    def _ordered_slots(self) -> list[_CallSlot]:
        return sorted(self._slots, key=lambda s: (s.index, s.seq))

    def _calls(self) -> tuple[DeclaredCall, ...]:
        calls: list[DeclaredCall] = []
        used: set[str] = set()
        for ordinal, slot in enumerate(self._ordered_slots()):
            call_id = slot.id if slot.id and slot.id not in used else self._synth_id(ordinal, used)
            used.add(call_id)
            calls.append(DeclaredCall(call_id, slot.name, "".join(slot.parts)))
        return tuple(calls)

    def _synth_id(self, ordinal: int, used: set[str]) -> str:
        candidate, n = f"{self._id_prefix}_{ordinal}", 0
        while candidate in used or any(s.id == candidate for s in self._slots):
            n += 1
            candidate = f"{self._id_prefix}_{ordinal}_{n}"
        return candidate


@dataclass(frozen=True)
class ToolResult:
    """One call's result as persisted: failed results and placeholders carry their prefix."""

    call_id: str
    name: str
    text: str
    status: Literal["ok", "failed", "placeholder"]


@dataclass(frozen=True)
class FlushedRound:
    round: Round
    results: tuple[ToolResult, ...]  # one per declared call, in declared order
    reason: PlaceholderReason | None  # why placeholders were made, None if none were needed


@dataclass(frozen=True)
class ResultOutcome:
    """What became of a result handed to `add_result`.

    accepted: stored, calls still open; complete: stored and every call now has a result;
    stitched: replaced a `superseded` placeholder of a flushed round (persist `result` over it);
    unknown / duplicate / closed: dropped (no such call; already answered; the round was flushed
    as canceled or interrupted).
    """

    kind: Literal["accepted", "complete", "stitched", "unknown", "duplicate", "closed"]
    call_id: str
    result: ToolResult | None = None

    @property
    def dropped(self) -> bool:
        return self.kind in ("unknown", "duplicate", "closed")


def placeholder_text(reason: PlaceholderReason) -> str:
    return f"{PLACEHOLDER_PREFIX}{reason}"


class RoundResults:
    """Pairs the results of one round with its declared calls."""

    def __init__(self, round: Round) -> None:
        self.round = round
        self._by_id = {call.id: call for call in round.calls}
        self._results: dict[str, ToolResult] = {}
        self.flushed: FlushedRound | None = None

    @property
    def pending_ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.round.calls if c.id not in self._results)

    @property
    def complete(self) -> bool:
        return not self.pending_ids

    def declares(self, call_id: str) -> bool:
        return call_id in self._by_id

    def add_result(self, call_id: str, text: str, failed: bool = False) -> ResultOutcome:
        call = self._by_id.get(call_id)
        if call is None:
            return ResultOutcome("unknown", call_id)
        previous = self._results.get(call_id)
        result = ToolResult(call_id, call.name, FAILED_PREFIX + text if failed else text,
                            "failed" if failed else "ok")
        if self.flushed is not None:
            return self._late_result(previous, result)
        if previous is not None:
            return ResultOutcome("duplicate", call_id)
        self._results[call_id] = result
        return ResultOutcome("complete" if self.complete else "accepted", call_id, result)

    def flush(self, reason: PlaceholderReason | None = None) -> FlushedRound:
        """Close the round: calls without a result get a placeholder naming `reason`.

        Flushing again returns the round as it stands (with any stitched results)."""
        if self.flushed is not None:
            return self._current()
        pending = self.pending_ids
        if pending and reason is None:
            raise ValueError(f"calls {', '.join(pending)} have no result; a reason is required")
        for call_id in pending:
            assert reason is not None  # checked above
            self._results[call_id] = ToolResult(
                call_id, self._by_id[call_id].name, placeholder_text(reason), "placeholder"
            )
        self.flushed = FlushedRound(self.round, (), reason if pending else None)
        return self._current()

    def _late_result(self, previous: ToolResult | None, result: ToolResult) -> ResultOutcome:
        if previous is None or previous.status != "placeholder":
            return ResultOutcome("duplicate", result.call_id)
        if previous.text != placeholder_text("superseded"):
            return ResultOutcome("closed", result.call_id)
        self._results[result.call_id] = result
        return ResultOutcome("stitched", result.call_id, result)

    def _current(self) -> FlushedRound:
        assert self.flushed is not None
        results = tuple(self._results[c.id] for c in self.round.calls)
        self.flushed = replace(self.flushed, results=results)
        return self.flushed


ResultStep = tuple[ResultOutcome, FlushedRound | None]


class TurnRounds:
    """The rounds of one turn: the open one and those already flushed.

    New assistant output while calls are still open supersedes the open round (flushed with
    `superseded` placeholders); a result arriving later for one of those calls is stitched over
    its placeholder. A result is routed to whichever round declared its call.
    """

    def __init__(self, *, id_prefix: str = "call") -> None:
        self._id_prefix = id_prefix
        self._builders = 0
        self._open: RoundResults | None = None
        self._flushed: list[RoundResults] = []

    @property
    def open_round(self) -> RoundResults | None:
        return self._open

    def new_builder(self, *, guard_repetition: bool = True) -> RoundBuilder:
        """A builder for the next LLM call, whose synthesised ids cannot clash with earlier
        rounds of this turn."""
        self._builders += 1
        return RoundBuilder(id_prefix=f"{self._id_prefix}_r{self._builders}",
                            guard_repetition=guard_repetition)

    def add_round(self, round: Round) -> list[FlushedRound]:
        """Register a finished assistant round; returns the rounds to persist now, in order:
        the previous round if it was still open (superseded), then this one if it has no
        calls (nothing to wait for)."""
        flushed = [f for f in (self.supersede(),) if f is not None]
        self._open = RoundResults(round)
        if not round.calls:
            flushed.append(self._flush_open(None))
        return flushed

    def on_output(self, event: StreamEvent) -> FlushedRound | None:
        """Call for each event of a new stream: non-empty text or reasoning while calls are
        open flushes the open round as superseded (returned, to be persisted first)."""
        if isinstance(event, (TextDelta, ReasoningDelta)) and event.text:
            return self.supersede()
        return None

    def supersede(self) -> FlushedRound | None:
        return self._flush_open("superseded") if self._open is not None else None

    def add_result(self, call_id: str, text: str, failed: bool = False) -> ResultStep:
        """Route a result. Returns its outcome and, when it completed the open round, the
        flushed round."""
        target = self._owner(call_id)
        if target is None:
            return ResultOutcome("unknown", call_id), None
        outcome = target.add_result(call_id, text, failed)
        if outcome.kind == "complete" and target is self._open:
            return outcome, self._flush_open(None)
        return outcome, None

    def close(self, reason: Literal["canceled", "interrupted"]) -> FlushedRound | None:
        """End of the turn by cancel or error: flush the open round with that reason."""
        return self._flush_open(reason) if self._open is not None else None

    def _owner(self, call_id: str) -> RoundResults | None:
        if self._open is not None and self._open.declares(call_id):
            return self._open
        for rounds in reversed(self._flushed):
            if rounds.declares(call_id):
                return rounds
        return None

    def _flush_open(self, reason: PlaceholderReason | None) -> FlushedRound:
        assert self._open is not None
        flushed = self._open.flush(reason)
        self._flushed.append(self._open)
        self._open = None
        return flushed


class FirstError:
    """Keeps the first persistence error of a turn. It is reported only when the turn itself
    had no error: a stream or cancel error is the more useful one to surface."""

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def record(self, error: BaseException | None) -> None:
        if self.error is None:
            self.error = error

    def reported(self, turn_error: BaseException | None) -> BaseException | None:
        return turn_error if turn_error is not None else self.error
