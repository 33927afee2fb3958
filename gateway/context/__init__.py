"""The context builder and shaper: what the model sees of a session, within its window."""

from __future__ import annotations

from gateway.context.assembly import tail_start
from gateway.context.budget import Budget, estimate_tokens, make_budget, message_chars, messages_chars
from gateway.context.builder import BuiltContext, ContextBuilder
from gateway.context.compaction import CompactionError, CompactionResult, summary_tokens
from gateway.context.render import INTERRUPTED, neutralise
from gateway.context.search import history_search, history_search_spec

__all__ = [
    "Budget",
    "BuiltContext",
    "CompactionError",
    "CompactionResult",
    "ContextBuilder",
    "INTERRUPTED",
    "estimate_tokens",
    "history_search",
    "history_search_spec",
    "make_budget",
    "message_chars",
    "messages_chars",
    "neutralise",
    "summary_tokens",
    "tail_start",
]
