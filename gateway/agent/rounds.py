"""One LLM stream -> one complete round: its text, reasoning and tool calls in declared order.

The builder copes with the ways providers fragment tool calls, and with a stream that turns
into a loop (the repetition guards cut it). Pairing each call with exactly one result is the
database's job, not this module's: a round's calls are stored with it (see turn.py), and
tool_calls.py settles each one with one result, a placeholder when the turn was stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.agent.guards import RepetitionCut, RepetitionGuard
from gateway.agent.messages import DeclaredCall
from gateway.llm.events import (
    Finish,
    ModelInfo,
    ReasoningDelta,
    Replay,
    StreamEvent,
    TextDelta,
    ToolCallDelta,
    Usage,
)


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
    # what the model's API needs back on this round's message in the turn's next rounds
    # ({"api", "data"}, gateway/llm/formats/), stored with it
    replay: dict[str, Any] | None = None

    @property
    def cut_off(self) -> bool:
        """The output limit ended the reply (a call's arguments may be incomplete)."""
        return self.finish_reason == "length"

    def traced(self) -> dict[str, Any]:
        """The round as its LLM_RESPONSE trace event describes it."""
        return {
            "finish_reason": self.finish_reason,
            "text": self.text,
            "reasoning_chars": len(self.reasoning),
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.calls],
            "repetition": self.repetition.where if self.repetition else None,
        }


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
        self._replay: dict[str, Any] | None = None
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
        if isinstance(event, Replay):
            # the model that produced it: a fallback to another model of the same API must not get it
            self._replay = {"api": event.api, "model": self._model, "data": event.data}
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
        return Round(text, reasoning, calls, finish, self._usage, cut, self._model, self._replay)

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
