"""Folding: the oldest rows before the pristine tail summarised into one compaction marker.

A fold is reported (`compaction_started` / `compaction_finished`) to whoever listens. A failed
fold never fails the turn (only a /compact asks for the error); a fold that lost the race to
another builder starts again from that builder's marker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.config import ContextConfig
from gateway.context.assembly import Assembler, Frame, tail_start
from gateway.context.budget import Budget, estimate_tokens
from gateway.context.cache import Entry, SessionCache
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
from gateway.context.render import summary_message, system_block
from gateway.llm import LLMError, chat_text, without_urls

log = logging.getLogger(__name__)

OnEvent = Callable[[str, dict[str, Any]], Awaitable[None]]


class Folding:
    def __init__(
        self,
        repo: Any,
        context: ContextConfig,
        assembler: Assembler,
        summarise: Summarise | None,
        on_event: OnEvent | None,
    ) -> None:
        self.repo = repo
        self.context = context
        self.assembler = assembler
        self.summarise = summarise
        self.on_event = on_event

    @property
    def can_fold(self) -> bool:
        """Only with a summariser: without one, the context is shaped but never folded."""
        return self.summarise is not None

    async def fold(
        self,
        cache: SessionCache,
        budget: Budget,
        system_prompt: str,
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
        span = fold_span(entries, edge, pinned_seq, max(chunk, 1_000), self.assembler.lods)
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
        await self.emit("compaction_started", payload)
        started = time.monotonic()
        try:
            summary = await self._summarise(cache, system_prompt, events, summary_tokens(folded_tokens))
        except Exception as exc:  # noqa: BLE001 - a failed fold must not fail the turn
            log.warning("session %s: compaction failed: %s", cache.session_id, exc)
            await self.emit("compaction_finished", {**payload, "error": str(exc), "duration_ms": _ms(started)})
            if strict:  # said in the chat (/compact): no server address in it
                said = chat_text(exc) if isinstance(exc, LLMError) else without_urls(str(exc))
                raise CompactionError(f"the summariser failed: {said}") from exc
            return None
        return await self._record_fold(
            cache,
            budget,
            system_prompt,
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
        request = summary_request(system_prompt, first, cache.summary, events, budget)
        summary = (await self.summarise(request, budget + budget // 4)).strip()
        if not summary:
            raise CompactionError("the summariser returned an empty summary")
        return summary

    async def _record_fold(  # noqa: PLR0913 - the fold's whole state, passed once
        self,
        cache: SessionCache,
        budget: Budget,
        system_prompt: str,
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
        frame = Frame(system_block(system_prompt), None, summary_message(summary))
        after_view = self.assembler.assemble(cache, remaining, frame, turn_seq, 0, not budget.unbudgeted, memo=False)
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
            await self.emit(
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
        await self.emit("compaction_finished", result.payload())
        return result

    async def emit(self, kind: str, payload: dict[str, Any]) -> None:
        if self.on_event is None:
            return
        try:
            await self.on_event(kind, payload)
        except Exception:  # noqa: BLE001 - reporting must not break the build
            log.exception("context event handler failed for %s", kind)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
