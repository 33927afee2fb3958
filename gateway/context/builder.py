"""The context builder: history -> chat messages that fit the model's window.

Each round: refresh the session cache (only what changed), drop orphaned requests, then shape:
0. render as before (same LOD boundary); if it fits the target, the prefix is untouched;
1. otherwise move the LOD boundary forward, to a multiple of `lod_step` rows before the
   pristine tail, then to the tail's edge, stubbing older tool results as their tools declare;
2. still over: fold the oldest rows before the tail into a summary (at most
   `max_folds_per_build` times), recording a marker, and shape again.
A window of 0 is unbudgeted: no caps, no stubs, no folds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gateway.attachments.images import ImageParts
from gateway.config import AgentConfig, AttachmentsConfig, ContextConfig, LLMConfig
from gateway.context.budget import (
    CHARS_PER_TOKEN,
    MESSAGE_OVERHEAD_CHARS,
    Budget,
    Corrections,
    estimate_tokens,
    make_budget,
    message_chars,
)
from gateway.context.cache import Caches, Entry, SessionCache, refresh
from gateway.context.compaction import (
    UNBUDGETED_CHUNK_TOKENS,
    CompactionError,
    CompactionResult,
    FoldReason,
    Summarise,
    fold_span,
    summary_request,
    summary_tokens,
)
from gateway.context.render import (
    OPENING,
    Limits,
    Lod,
    Message,
    merge_user,
    mergeable,
    merged,
    system_block,
    tail_block,
)
from gateway.llm.discovery import FALLBACK_WINDOW
from gateway.store.records import SessionRecord

log = logging.getLogger(__name__)

OnEvent = Callable[[str, dict[str, Any]], Awaitable[None]]
EVERY_ROW_IS_EARLIER = 2**62  # the turn_started_seq of a /compact: no row belongs to a running turn


@dataclass(frozen=True)
class BuiltContext:
    messages: list[Message]  # OpenAI chat format; treat the dicts as read-only (they are cached)
    estimated_tokens: int
    folded: int  # rows folded into a summary during this build
    target: int = 0  # where shaping starts, 0 when unbudgeted
    compactions: tuple[CompactionResult, ...] = ()


@dataclass
class _View:
    messages: list[Message]
    chars: int


@dataclass(frozen=True)
class _Memo:
    """The history assembled last time, to extend instead of assembling again: `done` entries
    rendered into `history` (`chars` long) for `turn_seq`, under `key` (what else decides how
    rows render). `before_turn` is the state before that turn's first row, where a later turn
    (a larger turn_seq) picks up, since the rows before it render alike for it."""

    key: tuple | None
    turn_seq: int
    done: int
    history: list[Message]
    chars: int
    before_turn: _Memo | None = None

    def resume(self, key: tuple, turn_seq: int, entries: int) -> _Memo | None:
        if key != self.key or entries < self.done:
            return None
        if turn_seq == self.turn_seq:
            return self
        if turn_seq > self.turn_seq and self.before_turn is not None:
            return self.before_turn
        return None


@dataclass(frozen=True)
class _Frame:
    system: Message
    tail: Message | None


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


class ContextBuilder:
    def __init__(
        self,
        store: Any,
        context: ContextConfig,
        llm: LLMConfig,
        agent: AgentConfig,
        summarise: Summarise | None = None,
        on_event: OnEvent | None = None,
        tool_lod: Mapping[str, Lod] | None = None,
        attachments: AttachmentsConfig | None = None,
        windows: Callable[[str], Awaitable[int]] | None = None,
    ):
        self.store = store
        self.repo = store.history
        self.context = context
        self.llm = llm
        self.agent = agent
        self.summarise = summarise
        self.on_event = on_event
        self.lods: dict[str, Lod] = dict(tool_lod or {})
        attachments = attachments or AttachmentsConfig()
        self.image_turns = attachments.image_turns
        images = ImageParts(Path(agent.workspace), attachments.image_max_side, CHARS_PER_TOKEN) if llm.vision else None
        self.limits = Limits(
            agent.max_tool_result_chars,
            context.lod_above_chars,
            context.max_tool_result_chars,
            llm.verbatim_tool_results,
            images,
            llm.tool_call_content == "null",
        )
        self.corrections = Corrections()
        self.windows = windows  # asks the server a model's window (`llm.context_window: auto`)
        self._discovered: dict[str, int] = {}
        self.caches = Caches()

    # ---- budget ----------------------------------------------------------------------------
    def window_of(self, model: str) -> int:
        """The window shaping aims at: configured or discovered, or smaller once a refusal taught it."""
        configured = self.llm.context_window
        window = self._discovered.get(model, FALLBACK_WINDOW) if configured == "auto" else configured
        return self.corrections.window_for(model, window)

    async def _discover(self, model: str) -> None:
        if self.llm.context_window == "auto" and model not in self._discovered and self.windows is not None:
            self._discovered[model] = await self.windows(model)

    def estimate(self, model: str, chars: int) -> int:
        """Tokens of `chars` characters of text, as this model's corrected estimate counts them."""
        return self.budget(model).tokens(chars)

    def budget(self, model: str) -> Budget:
        window = self.window_of(model)
        factor = self.corrections.get(model).factor
        return make_budget(window, self.llm.reserve_pct, self.context.headroom_tokens, factor)

    def observe_usage(self, model: str, estimated_tokens: int, prompt_tokens: int) -> None:
        """The provider's count of a prompt we estimated: keep the estimate from erring low."""
        self.corrections.observe(model, estimated_tokens, prompt_tokens)

    def correct_from_refusal(
        self, model: str, estimated_tokens: int, prompt_tokens: int | None, context_window: int | None
    ) -> None:
        """A context-too-long refusal: learn from the server's numbers so the rebuild is smaller."""
        self.corrections.refused(model, estimated_tokens, prompt_tokens, context_window)
        log.info(
            "context refused for %s: estimated %s, server counted %s of %s",
            model,
            estimated_tokens,
            prompt_tokens,
            context_window,
        )

    # ---- build -----------------------------------------------------------------------------
    async def build(
        self,
        session: SessionRecord,
        *,
        system_prompt: str,
        turn_started_seq: int,
        notes: dict[str, str],
        now: datetime,
        timezone: str,
        workspace: str,
        reminder: str | None = None,
        model: str,
    ) -> BuiltContext:
        cache = self.caches.get(session.id)
        await refresh(cache, self.repo, turn_started_seq)
        await self._drop_orphans(cache, turn_started_seq)
        await self._discover(model)
        budget = self.budget(model)
        tail = tail_block(now, timezone, workspace, reminder)
        folds: list[CompactionResult] = []
        while True:
            frame = _Frame(system_block(system_prompt, notes, self._summary(cache)), tail)
            view = self._shape(cache, budget, frame, turn_started_seq)
            if budget.fits(view.chars) or len(folds) >= self.context.max_folds_per_build or self.summarise is None:
                break
            result = await self._fold(
                cache, budget, system_prompt, notes, turn_started_seq, "budget", budget.tokens(view.chars)
            )
            if result is None:
                break
            folds.append(result)
        if not budget.fits(view.chars):
            log.warning(
                "session %s: context of %s tokens is over the target %s",
                session.id,
                budget.tokens(view.chars),
                budget.target,
            )
        return BuiltContext(
            view.messages, budget.tokens(view.chars), sum(f.entries_folded for f in folds), budget.target, tuple(folds)
        )

    async def compact_now(self, session: SessionRecord, *, system_prompt: str) -> CompactionResult | None:
        """Fold everything before the pristine tail now (/compact). None when nothing can be folded."""
        if self.summarise is None:
            raise CompactionError("no summariser is configured, so the conversation cannot be compacted")
        cache = self.caches.get(session.id)
        turn_seq = EVERY_ROW_IS_EARLIER
        await refresh(cache, self.repo, turn_seq)
        await self._discover(self.llm.model)
        budget = self.budget(self.llm.model)
        results: list[CompactionResult] = []
        for _ in range(max(1, self.context.max_folds_per_build)):
            before = self._measure(cache, budget, system_prompt, {}, turn_seq, self._summary(cache))
            result = await self._fold(cache, budget, system_prompt, {}, turn_seq, "manual", before, strict=True)
            if result is None:
                break
            results.append(result)
        if not results:
            return None
        first, last = results[0], results[-1]
        return CompactionResult(
            session.id,
            "manual",
            first.first_seq,
            last.last_seq,
            sum(r.entries_folded for r in results),
            first.tokens_before,
            last.tokens_after,
            sum(r.duration_ms for r in results),
            last.summary,
        )

    def forget(self, session_id: int) -> None:
        """Drop what is cached for a session (a /new, or rows changed behind the builder's back)."""
        self.caches.drop(session_id)

    # ---- shaping ---------------------------------------------------------------------------
    def _shape(self, cache: SessionCache, budget: Budget, frame: _Frame, turn_seq: int) -> _View:
        entries = cache.visible()
        if budget.unbudgeted:
            return self._assemble(cache, entries, frame, turn_seq, lod_seq=0, cap=False)
        view = self._assemble(cache, entries, frame, turn_seq, cache.lod_seq, cap=True)
        if budget.fits(view.chars):
            return view  # phase 0: the prefix stays exactly as it was sent last time
        for seq in self._lod_moves(cache, entries):
            cache.lod_seq = seq
            view = self._assemble(cache, entries, frame, turn_seq, seq, cap=True)
            if budget.fits(view.chars):
                break
        return view

    def _lod_moves(self, cache: SessionCache, entries: list[Entry]) -> list[int]:
        """Forward positions for the LOD boundary: a multiple of lod_step rows, then the tail edge."""
        edge = tail_start(entries, self.context.keep_messages, self.context.keep_tool_exchanges)
        step = max(1, self.context.lod_step)
        seqs = [entries[i].seq if i < len(entries) else cache.max_seq + 1 for i in ((edge // step) * step, edge)]
        return sorted({s for s in seqs if s > cache.lod_seq})

    def _assemble(
        self,
        cache: SessionCache,
        entries: list[Entry],
        frame: _Frame,
        turn_seq: int,
        lod_seq: int,
        cap: bool,
        *,
        memo: bool = True,
    ) -> _View:
        pinned = cache.pinned if self.context.pin_first_user else None
        if pinned is not None and pinned.seq <= cache.base_seq:
            entries = [Entry(pinned), *entries]
        image_seq = self._image_seq(entries)
        key = (cache.stamp, cache.base_seq, lod_seq, cap, pinned.seq if pinned else None, image_seq)
        start = _Memo(key, turn_seq, 0, [], 0)
        if memo and cache.memo is not None:
            start = cache.memo.resume(key, turn_seq, len(entries)) or start
        history = list(start.history)
        chars, before_turn = self._extend(history, start.chars, entries, start.done, turn_seq, lod_seq, cap, image_seq)
        if memo:
            if before_turn is None and start.turn_seq == turn_seq:
                before_turn = start.before_turn  # crossed in an earlier build of this turn
            if before_turn is None:  # no row of this turn yet: a later turn starts from the end
                before_turn = _Memo(key, turn_seq, len(entries), list(history), chars)
            cache.memo = _Memo(key, turn_seq, len(entries), history, chars, before_turn)
        return _View(*_framed(frame, history, chars))

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
    ) -> tuple[int, _Memo | None]:
        """Append the rendered messages of entries[done:], merging consecutive user messages.
        Also returns the state just before the first row of the current turn (None when it is
        not among them): rows before it render alike in every later turn."""
        limits, lods, cap_bit = self.limits, self.lods, int(cap)
        before_turn = None
        for index in range(done, len(entries)):
            entry = entries[index]
            seq = entry.row.seq
            if seq >= turn_seq and before_turn is None and (index == 0 or entries[index - 1].row.seq < turn_seq):
                before_turn = _Memo(None, turn_seq, index, list(history), chars)
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

    def _measure(
        self,
        cache: SessionCache,
        budget: Budget,
        system_prompt: str,
        notes: dict[str, str],
        turn_seq: int,
        summary: str | None,
    ) -> int:
        frame = _Frame(system_block(system_prompt, notes, summary), None)
        view = self._assemble(
            cache,
            cache.visible(),
            frame,
            turn_seq,
            0 if budget.unbudgeted else cache.lod_seq,
            not budget.unbudgeted,
            memo=False,
        )
        return budget.tokens(view.chars)

    @staticmethod
    def _summary(cache: SessionCache) -> str | None:
        return cache.marker.summary if cache.marker else None

    # ---- orphans ---------------------------------------------------------------------------
    async def _drop_orphans(self, cache: SessionCache, turn_seq: int) -> None:
        """User rows of an earlier turn that never got an answer (a crash) would read as part of
        this turn's request: mark them failed so they are excluded, here and in the database."""
        orphans: list[Entry] = []
        for entry in reversed(cache.visible()):
            if entry.seq >= turn_seq:
                continue
            if entry.row.role == "assistant":
                break
            if entry.row.role == "user" and not entry.row.synthetic:
                orphans.append(entry)
        if orphans:
            await self.store.sessions.mark_failed([e.row.id for e in orphans])
            cache.mark_failed({e.seq for e in orphans})
            log.info("session %s: marked unanswered rows %s failed", cache.session_id, [e.seq for e in orphans])

    # ---- folding ---------------------------------------------------------------------------
    async def _fold(
        self,
        cache: SessionCache,
        budget: Budget,
        system_prompt: str,
        notes: dict[str, str],
        turn_seq: int,
        reason: FoldReason,
        tokens_before: int,
        *,
        strict: bool = False,
    ) -> CompactionResult | None:
        entries = cache.visible()
        edge = tail_start(entries, self.context.keep_messages, self.context.keep_tool_exchanges)
        pinned_seq = cache.pinned.seq if (cache.pinned and self.context.pin_first_user) else None
        chunk = budget.budget // 2 if not budget.unbudgeted else UNBUDGETED_CHUNK_TOKENS
        span = fold_span(entries, edge, pinned_seq, max(chunk, 1_000), self.lods)
        if not span:
            return None
        events = "\n".join(text for _, text in span)
        folded_tokens = estimate_tokens(len(events))
        payload = {
            "session_id": cache.session_id,
            "reason": reason,
            "tokens_before": tokens_before,
            "target": budget.target,
            "entries": len(span),
            "first_seq": span[0][0].seq,
            "last_seq": span[-1][0].seq,
        }
        await self._emit("compaction_started", payload)
        started = time.monotonic()
        try:
            summary = await self._summarise(cache, system_prompt, events, summary_tokens(folded_tokens))
        except Exception as exc:  # noqa: BLE001 - a failed fold must not fail the turn
            log.warning("session %s: compaction failed: %s", cache.session_id, exc)
            await self._emit("compaction_finished", {**payload, "error": str(exc), "duration_ms": _ms(started)})
            if strict:
                raise CompactionError(f"the summariser failed: {exc}") from exc
            return None
        return await self._record_fold(
            cache,
            budget,
            system_prompt,
            notes,
            turn_seq,
            reason,
            tokens_before,
            span,
            events,
            summary,
            started,
            payload,
        )

    async def _summarise(self, cache: SessionCache, system_prompt: str, events: str, budget: int) -> str:
        assert self.summarise is not None
        first = cache.pinned.content if cache.pinned else None
        request = summary_request(system_prompt, first, self._summary(cache), events, budget)
        summary = (await self.summarise(request, budget + budget // 4)).strip()
        if not summary:
            raise CompactionError("the summariser returned an empty summary")
        return summary

    async def _record_fold(  # noqa: PLR0913 - the fold's whole state, passed once
        self,
        cache: SessionCache,
        budget: Budget,
        system_prompt: str,
        notes: dict[str, str],
        turn_seq: int,
        reason: FoldReason,
        tokens_before: int,
        span: list[tuple[Entry, str]],
        events: str,
        summary: str,
        started: float,
        payload: dict[str, Any],
    ) -> CompactionResult | None:
        last_seq = span[-1][0].seq
        remaining = [e for e in cache.visible() if e.seq > last_seq]
        frame = _Frame(system_block(system_prompt, notes, summary), None)
        after_view = self._assemble(cache, remaining, frame, turn_seq, 0, not budget.unbudgeted, memo=False)
        tokens_after = budget.tokens(after_view.chars)
        marker = await self.repo.add_compaction(
            cache.session_id,
            expected_last_seq=cache.base_seq,
            first_seq=span[0][0].seq,
            last_seq=last_seq,
            summary=summary,
            folded_text=events,
            tokens_before=tokens_before,
            tokens_after=tokens_after,
        )
        if marker is None:  # another builder folded first: start again from its marker
            cache.reset(None)
            await self._emit(
                "compaction_finished", {**payload, "error": "superseded by another fold", "duration_ms": _ms(started)}
            )
            return None
        cache.advance(marker)
        result = CompactionResult(
            cache.session_id,
            reason,
            marker.first_seq,
            last_seq,
            len(span),
            tokens_before,
            tokens_after,
            _ms(started),
            summary,
        )
        await self._emit("compaction_finished", result.payload())
        return result

    async def _emit(self, kind: str, payload: dict[str, Any]) -> None:
        if self.on_event is None:
            return
        try:
            await self.on_event(kind, payload)
        except Exception:  # noqa: BLE001 - reporting must not break the build
            log.exception("context event handler failed for %s", kind)


def _framed(frame: _Frame, history: list[Message], chars: int) -> tuple[list[Message], int]:
    """System first, the history, then the tail, in an order every strict template accepts:
    a user message first, and the tail (what changes every round) at the very end, joined to
    the last user message when the history ends with one."""
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


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
