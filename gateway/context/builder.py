"""The context builder: history -> chat messages that fit the model's window.

Each round: refresh the session cache (only what changed), drop orphaned requests, then:
0. render as before (same LOD boundary, same summary); if it fits, the prefix is untouched:
   the target in a turn's first round, the whole budget between its tool rounds;
1. otherwise shape, once, down to the low water (hysteresis, so the prefix then stays put for
   a while): move the LOD boundary forward, to a multiple of `lod_step` rows before the
   pristine tail, then to the tail's edge, stubbing older tool results as their tools declare;
2. still over: fold the oldest rows before the tail into a summary (at most
   `max_folds_per_build` times), recording a marker, and stub again; still over (the pristine
   tail alone is): stub the tail's results of earlier turns too. The change is said as
   `prefix_changed`.
A window of 0 is unbudgeted: no caps, no stubs, no folds.
Before any of it, the fixed part (the system prompt, the memory and the tools' schemas) is
fitted to the window (`fitting.py`); the tools are counted in every fit after that.
Rows become messages in `assembly.py`; a fold is `folding.py`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gateway.attachments.images import ImageParts
from gateway.config import AgentConfig, AttachmentsConfig, ContextConfig, LLMConfig
from gateway.context.assembly import EVERY_ROW_IS_EARLIER, Assembler, Frame, View, tail_start
from gateway.context.budget import CHARS_PER_TOKEN, Budget, Corrections, estimate_tokens, make_budget
from gateway.context.cache import Caches, Entry, SessionCache, refresh
from gateway.context.compaction import CompactionError, CompactionResult, Summarise
from gateway.context.fitting import Fit, Tool, fit_request, memory_allowance, sample_text
from gateway.context.folding import Folding, OnEvent
from gateway.context.render import Limits, Lod, Message, summary_message, system_block, tail_block
from gateway.llm.discovery import FALLBACK_WINDOW
from gateway.store.records import SessionRecord

log = logging.getLogger(__name__)
Count = Callable[[str, str], Awaitable["int | None"]]  # (text, model) -> tokens by the server's tokenizer


@dataclass(frozen=True)
class BuiltContext:
    messages: list[Message]  # OpenAI chat format; treat the dicts as read-only (they are cached)
    estimated_tokens: int
    folded: int  # rows folded into a summary during this build
    target: int = 0  # where shaping starts, 0 when unbudgeted
    compactions: tuple[CompactionResult, ...] = ()
    tools: tuple[Tool, ...] = ()  # the tools' schemas to send, fitted to the window
    raw_tokens: int = 0  # `estimated_tokens` before the model's correction factor (what corrections learn from)


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
        count: Count | None = None,
    ):
        self.store = store
        self.repo = store.history
        self.context = context
        self.llm = llm
        self.agent = agent
        self.lods: dict[str, Lod] = dict(tool_lod or {})
        attachments = attachments or AttachmentsConfig()
        images = (
            ImageParts(
                Path(agent.workspace),
                attachments.image_max_side,
                CHARS_PER_TOKEN,
                max_pixels=attachments.max_image_pixels,
            )
            if llm.vision
            else None
        )
        self.images = images
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
        self.count = count  # the server's tokenizer, when it has one: calibrates a model's estimate once
        self._calibrations: dict[str, asyncio.Task[None]] = {}  # one per model, joined by every build
        self._fits_said: set[tuple[str, int]] = set()  # (model, window) whose fit was logged
        self.caches = Caches()
        self.assembler = Assembler(context, self.limits, self.lods, attachments.image_turns)
        self.folding = Folding(self.repo, context, self.assembler, summarise, on_event)

    # ---- budget ----------------------------------------------------------------------------
    def window_of(self, model: str) -> int:
        """The window shaping aims at: configured (for that model: `llm.models.<name>.context_window`)
        or discovered, or smaller once a refusal taught it."""
        configured = self.llm.window_setting(model)
        window = self._discovered.get(model, FALLBACK_WINDOW) if configured == "auto" else configured
        return self.corrections.window_for(model, window)

    async def _discover(self, model: str) -> None:
        # Asked at every build: the client caches a discovered window and asks again, with
        # backoff, after a fallback (the server may have been down at start).
        if self.llm.window_setting(model) == "auto" and self.windows is not None:
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

    # ---- the fixed part ----------------------------------------------------------------------
    async def fit(
        self, model: str, system_prompt: str, memory: str = "", tools: Sequence[Tool] = (), *, quiet: bool = False
    ) -> Fit:
        """The system prompt, `memory` and `tools` fitted to the model's window; the first fit
        that had to cut something is logged, once per model and window (unless `quiet`)."""
        await self._discover(model)
        await self._calibrate(model, sample_text(system_prompt, tools))
        fit = fit_request(
            self.budget(model), system_prompt, memory, tools, priority=self.agent.tool_priority, model=model
        )
        if fit.cut and not quiet and (model, fit.window) not in self._fits_said:
            self._fits_said.add((model, fit.window))
            log.warning("%s (docs/context.md, \"Small windows\")", fit.describe())
        return fit

    async def memory_tokens(self, model: str, configured: int) -> int:
        """What the memory section may take for this model (`memory.budget_tokens` at most)."""
        await self._discover(model)
        return memory_allowance(self.budget(model), configured)

    async def _calibrate(self, model: str, text: str) -> None:
        """Once per model, before its first request: the server's tokenizer counts the fixed
        part, so an estimate that would err low (a model of one token a character) is
        corrected before a request is refused for it. A build meanwhile waits for the count."""
        if self.count is None or self.window_of(model) <= 0:
            return
        if model not in self._calibrations:
            self._calibrations[model] = asyncio.ensure_future(self._count_fixed(model, text, self.count))
        await asyncio.shield(self._calibrations[model])

    async def _count_fixed(self, model: str, text: str, count: Count) -> None:
        try:
            counted = await count(text, model)
        except Exception as exc:  # noqa: BLE001 - a count is a refinement; the estimate stands without it
            log.debug("counting the fixed part of %s failed: %s", model, exc)
            counted = None
        if counted:
            self.corrections.observe(model, estimate_tokens(len(text)), counted)
        else:  # no tokenizer (or no answer): a later build asks again, which costs nothing once it is known
            self._calibrations.pop(model, None)

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
        memory: str = "",
        tools: Sequence[Tool] = (),
    ) -> BuiltContext:
        """`system_prompt` (then `memory`) and `tools` are fitted to the window first; the
        result's `tools` are what to send."""
        cache = self.caches.get(session.id)
        await refresh(cache, self.repo, turn_started_seq)
        await self._drop_orphans(cache, turn_started_seq)
        await self._warm_images(cache)
        fit = await self.fit(model, system_prompt, memory, tools)
        system_prompt = fit.prompt
        budget = self.budget(model).with_fixed(fit.tools_chars)
        system, tail = system_block(system_prompt), tail_block(now, timezone, workspace, reminder, notes)
        view = self._render(cache, budget, Frame(system, tail, summary_message(cache.summary)), turn_started_seq)
        # Between the tool rounds of a turn the request is shaped only when it would not fit at
        # all; a turn's first round shapes from the target on. Either way down to the low water.
        limit = budget.budget if self._mid_turn(cache, turn_started_seq) else budget.target
        folds: list[CompactionResult] = []
        if not budget.within(view.chars, limit):
            view, folds = await self._reshape(cache, budget, system, tail, system_prompt, turn_started_seq, view)
        chars = view.chars + fit.tools_chars
        if not budget.fits(view.chars):
            tokens = budget.tokens(chars)
            log.warning("session %s: context of %s tokens is over the target %s", session.id, tokens, budget.target)
        return BuiltContext(
            view.messages, budget.tokens(chars), sum(f.entries_folded for f in folds), budget.target, tuple(folds),
            fit.tools, estimate_tokens(chars),
        )

    async def _reshape(  # noqa: PLR0913 - the round's whole frame, passed once
        self,
        cache: SessionCache,
        budget: Budget,
        system: Message,
        tail: Message,
        system_prompt: str,
        turn_seq: int,
        view: View,
    ) -> tuple[View, list[CompactionResult]]:
        """The one change of the prefix: older tool results stubbed (the LOD boundary moved
        forward), then the oldest rows folded, until the request is down to the low water, so
        the prefix then stays as it is for as long as possible. Said to `on_event`
        (`prefix_changed`): the provider's cache misses from `from_seq` on."""
        before, lod_before = budget.tokens(view.chars), cache.lod_seq
        folds: list[CompactionResult] = []
        low = budget.low_water
        while True:
            view = self._stub(cache, budget, Frame(system, tail, summary_message(cache.summary)), turn_seq, low)
            if budget.within(view.chars, low) or len(folds) >= self.context.max_folds_per_build:
                break
            if not self.folding.can_fold:
                break
            result = await self.folding.fold(
                cache, budget, system_prompt, turn_seq, "budget", budget.tokens(view.chars)
            )
            if result is None:
                break
            folds.append(result)
        if not budget.within(view.chars, low):  # the pristine tail alone is over: its earlier turns' results
            frame = Frame(system, tail, summary_message(cache.summary))
            view = self._stub(cache, budget, frame, turn_seq, low, deep=True)
        stubbed_from = lod_before if cache.lod_seq > lod_before and not folds else None
        if folds or stubbed_from is not None:
            await self.folding.emit(
                "prefix_changed",
                {
                    "session_id": cache.session_id,
                    "reason": "fold" if folds else "stubs",
                    "from_seq": folds[0].first_seq if folds else stubbed_from,
                    "stubbed_before_seq": cache.lod_seq,
                    "folds": len(folds),
                    "tokens_before": before,
                    "tokens_after": budget.tokens(view.chars),
                    "target": budget.target,
                    "low_water": low,
                },
            )
        return view, folds

    async def compact_now(
        self, session: SessionRecord, *, system_prompt: str, model: str | None = None
    ) -> CompactionResult | None:
        """Fold everything before the pristine tail now (/compact). None when nothing can be folded."""
        if not self.folding.can_fold:
            raise CompactionError("no summariser is configured, so the conversation cannot be compacted")
        cache = self.caches.get(session.id)
        turn_seq = EVERY_ROW_IS_EARLIER
        await refresh(cache, self.repo, turn_seq)
        model = model or self.llm.ref(session.model)
        await self._discover(model)
        budget = self.budget(model)
        results: list[CompactionResult] = []
        for _ in range(max(1, self.context.max_folds_per_build)):
            before = self._measure(cache, budget, system_prompt, turn_seq, cache.summary)
            result = await self.folding.fold(cache, budget, system_prompt, turn_seq, "manual", before, strict=True)
            if result is None:
                break
            results.append(result)
        if not results:
            return None
        first, last = results[0], results[-1]
        await self.folding.emit("prefix_changed", {
            "session_id": session.id, "reason": "manual", "from_seq": first.first_seq, "folds": len(results),
            "tokens_before": first.tokens_before, "tokens_after": last.tokens_after,
        })
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

    async def _warm_images(self, cache: SessionCache) -> None:
        """Images of rows not yet rendered with them are decoded in a thread now, so rendering
        (on the event loop) does not decode them."""
        if self.images is None:
            return
        waiting = [
            record
            for entry in cache.visible()
            if entry.row.images and not any(key & 8 for key in entry.renders)  # render.MODES: 8 = images
            for record in entry.row.images
        ]
        if waiting:
            await self.images.warm(waiting)

    # ---- shaping ---------------------------------------------------------------------------
    def _render(self, cache: SessionCache, budget: Budget, frame: Frame, turn_seq: int) -> View:
        """The request as it was shaped last (the same stubs): what was sent, plus what is new."""
        if budget.unbudgeted:
            return self.assembler.assemble(cache, cache.visible(), frame, turn_seq, lod_seq=0, cap=False)
        return self.assembler.assemble(cache, cache.visible(), frame, turn_seq, cache.lod_seq, cap=True)

    @staticmethod
    def _mid_turn(cache: SessionCache, turn_seq: int) -> bool:
        """Whether the turn already asked the model (a row of it is the model's): between its
        tool rounds."""
        for entry in reversed(cache.visible()):
            if entry.seq < turn_seq:
                return False
            if entry.row.role == "assistant":
                return True
        return False

    def _stub(
        self, cache: SessionCache, budget: Budget, frame: Frame, turn_seq: int, low: int, *, deep: bool = False
    ) -> View:
        """Level of detail: the LOD boundary moved forward (never back) until the request is
        down to `low` or stands at the pristine tail (`deep`: at the current turn's first row,
        so the tail's results of earlier turns are stubbed too, never the current turn's)."""
        entries = cache.visible()
        view = self.assembler.assemble(cache, entries, frame, turn_seq, cache.lod_seq, cap=True)
        moves = self._lod_moves(cache, entries)
        if deep and turn_seq > cache.lod_seq:
            moves = sorted({*moves, min(turn_seq, cache.max_seq + 1)})
        for seq in moves:
            if budget.within(view.chars, low):
                break
            cache.lod_seq = seq
            view = self.assembler.assemble(cache, entries, frame, turn_seq, seq, cap=True)
        return view

    def _lod_moves(self, cache: SessionCache, entries: list[Entry]) -> list[int]:
        """Forward positions for the LOD boundary: a multiple of lod_step rows, then the tail edge."""
        edge = tail_start(entries, self.context.keep_messages, self.context.keep_tool_exchanges)
        step = max(1, self.context.lod_step)
        seqs = [entries[i].seq if i < len(entries) else cache.max_seq + 1 for i in ((edge // step) * step, edge)]
        return sorted({s for s in seqs if s > cache.lod_seq})

    def _measure(
        self,
        cache: SessionCache,
        budget: Budget,
        system_prompt: str,
        turn_seq: int,
        summary: str | None,
    ) -> int:
        frame = Frame(system_block(system_prompt), None, summary_message(summary))
        view = self.assembler.assemble(
            cache,
            cache.visible(),
            frame,
            turn_seq,
            0 if budget.unbudgeted else cache.lod_seq,
            not budget.unbudgeted,
            memo=False,
        )
        return budget.tokens(view.chars)

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
