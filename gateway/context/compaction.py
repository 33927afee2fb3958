"""Folding old history into a summary: the span, the summariser's prompt, the searchable text.

One fold is one LLM call. The summariser is told the session's task first (its system prompt
and first request) so it keeps what the task needs rather than what was largest, then the
previous summary (summaries are cumulative: the newest marker's summary covers everything
folded so far), then the numbered rows. The same row text is stored with the marker so the span
stays findable by `history_search`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from gateway.context.budget import estimate_tokens
from gateway.context.cache import Entry
from gateway.context.render import Lod, stub, tool_text
from gateway.store.history import HistoryRow

Summarise = Callable[[list[dict[str, Any]], int], Awaitable[str]]
FoldReason = Literal["budget", "manual"]

SUMMARY_MIN_TOKENS = 500
SUMMARY_MAX_TOKENS = 8192
ROW_TEXT_CHARS = 8_000  # a pasted document is kept to its start in the summariser's input
RESULT_TEXT_CHARS = 2_000  # tool output is what summaries must drop first
UNBUDGETED_CHUNK_TOKENS = 32_000  # fold input when the window is unknown (a manual /compact)

SUMMARY_SYSTEM = (
    "You compact conversation history. You write the summary an assistant will continue the "
    "conversation from: it replaces the events below, which the assistant will no longer see."
)


class CompactionError(Exception):
    """A fold that was asked for could not be made; the message says why."""


@dataclass(frozen=True)
class CompactionResult:
    session_id: int
    reason: FoldReason
    first_seq: int
    last_seq: int
    entries_folded: int
    tokens_before: int
    tokens_after: int
    duration_ms: int
    summary: str

    def payload(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "reason": self.reason,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "entries_folded": self.entries_folded,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "duration_ms": self.duration_ms,
            "summary_chars": len(self.summary),
        }


def summary_tokens(folded_tokens: int) -> int:
    """About an eighth of what is folded, within [500, 8192] tokens."""
    return min(SUMMARY_MAX_TOKENS, max(SUMMARY_MIN_TOKENS, folded_tokens // 8))


def row_text(row: HistoryRow, lods: dict[str, Lod]) -> str:
    """One row as the summariser (and the search index) sees it: numbered and dated."""
    stamp = row.created_at.strftime("%Y-%m-%d %H:%M")
    speaker = "notice" if row.synthetic else row.role
    lines = (
        [f"#{row.seq} {stamp} {speaker}: {stub(row.content, 'message', ROW_TEXT_CHARS, 'head')}"] if row.content else []
    )
    for call in row.calls:
        result = stub(tool_text(call), call.name, RESULT_TEXT_CHARS, lods.get(call.name, "head"))
        lines.append(f"#{row.seq} {stamp} tool {call.name}({call.arguments}) -> {call.status}: {result}")
    return "\n".join(lines)


def fold_span(
    entries: list[Entry], tail_index: int, pinned_seq: int | None, chunk_tokens: int, lods: dict[str, Lod]
) -> list[tuple[Entry, str]]:
    """The oldest contiguous rows before the pristine tail that fit one summariser call.

    Whole rows only: an assistant row carries its calls and their results, so a fold never
    separates a call from its result. The pinned first request is never folded.
    """
    span: list[tuple[Entry, str]] = []
    used = 0
    for entry in entries[:tail_index]:
        if entry.seq == pinned_seq:
            continue
        text = row_text(entry.row, lods)
        cost = estimate_tokens(len(text))
        if span and used + cost > chunk_tokens:
            break
        span.append((entry, text))
        used += cost
    return span


def summary_request(
    task: str, first_request: str | None, previous: str | None, events: str, budget: int
) -> list[dict[str, Any]]:
    parts = [f"# The session's task\n{task.strip() or '(no system prompt)'}"]
    if first_request:
        parts.append(f"# The session's first request\n{first_request.strip()}")
    if previous:
        parts.append(f"# Summary of what was folded before (carry it forward)\n{previous.strip()}")
    parts.append(
        "# Instructions\n"
        f"Write one summary of about {budget} tokens that replaces the previous summary and the events "
        "below. Keep what the task needs: decisions and their reasons, facts learned, names, paths, "
        "numbers, open questions and promises, the current state of the work. Drop chatter and raw "
        "tool output. Mention the message numbers (#N) of important events. Write plain text."
    )
    parts.append(f"# Events\n{events}")
    return [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]
