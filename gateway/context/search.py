"""`history_search`: find and quote what was folded out of the context.

Registered like any tool (`history_search_spec(store)`); it searches the folded spans of every
session of the calling thread (never another thread's) and answers with quoted snippets, their
message numbers and dates.
"""

from __future__ import annotations

from typing import Any

from gateway.store.history_search import HistoryHit, query_words
from gateway.tools.registry import ToolContext, ToolError, ToolSpec, build_spec

MAX_LIMIT = 20
SUMMARY_PREVIEW_CHARS = 300


async def history_search(store: Any, session_id: int, query: str, limit: int = 5) -> str:
    """Search the folded history of the session's thread; the answer is text for the model."""
    if not query_words(query):
        raise ToolError("query must contain at least one word to search for, e.g. \"database migration decision\"")
    if not 1 <= limit <= MAX_LIMIT:
        raise ToolError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    session = await store.sessions.get(session_id)
    if session is None:
        raise ToolError(f"session {session_id} does not exist")
    hits = await store.history.search(session.thread_key, query, limit=limit)
    if not hits:
        return f"No earlier (summarised) conversation matches {query!r}. Everything newer is still in your context."
    lines = [f"{len(hits)} match(es) in earlier, summarised conversation for {query!r}:"]
    lines += [format_hit(i, hit) for i, hit in enumerate(hits, 1)]
    return "\n\n".join(lines)


def format_hit(number: int, hit: HistoryHit) -> str:
    when = _span_dates(hit)
    summary = hit.summary if len(hit.summary) <= SUMMARY_PREVIEW_CHARS else hit.summary[:SUMMARY_PREVIEW_CHARS] + "…"
    quote = " ".join(hit.snippet.split()) or "(no excerpt)"
    session = f"session {hit.session_id}, " if hit.session_id else ""
    return (
        f"{number}. {session}messages #{hit.first_seq}–#{hit.last_seq}, {when}"
        f"\n   quote: \"{quote}\"\n   summary: {summary}"
    )


def _span_dates(hit: HistoryHit) -> str:
    first, last = hit.first_at, hit.last_at
    if first is None or last is None:
        return f"folded {hit.folded_at:%Y-%m-%d %H:%M} UTC"
    if first.date() == last.date():
        return f"{first:%Y-%m-%d %H:%M}–{last:%H:%M} UTC"
    return f"{first:%Y-%m-%d %H:%M} – {last:%Y-%m-%d %H:%M} UTC"


def history_search_spec(store: Any) -> ToolSpec:
    """The tool spec to register: `registry.register(history_search_spec(store))`."""

    async def history_search_tool(ctx: ToolContext, query: str, limit: int = 5) -> str:
        """Search earlier conversation in this chat that was summarised out of your context, and quote it.

        Use it when the user refers to something discussed long ago that you no longer see.

        Args:
            query: words to look for, e.g. "postgres migration decision"
            limit: how many matches to return (1-20)
        """
        return await history_search(store, ctx.session_id, query, limit)

    return build_spec(history_search_tool, name="history_search")

