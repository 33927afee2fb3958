"""`history_search`: find and quote what was folded out of the context, and earlier sessions.

Registered like any tool (`history_search_spec(store)`); it searches the folded spans of every
session of the calling thread, and the messages of its earlier sessions, and in a direct
message also the person's other direct-message sessions: never another person's, nor a group's
the thread is not. It answers with quoted snippets, each naming its session and date.
"""

from __future__ import annotations

from typing import Any

from gateway.store.history_search import HistoryHit, SessionHit, query_words
from gateway.tools.registry import ToolContext, ToolError, ToolSpec, build_spec

MAX_LIMIT = 20
SUMMARY_PREVIEW_CHARS = 300


async def history_search(
    store: Any, session_id: int, query: str, limit: int = 5, *, person: tuple[str, str] | None = None
) -> str:
    """Search the session's thread (its folded history and earlier sessions) and, with `person`
    (channel, user id: asked in their direct message), their other direct-message sessions."""
    if not query_words(query):
        raise ToolError("query must contain at least one word to search for, e.g. \"database migration decision\"")
    if not 1 <= limit <= MAX_LIMIT:
        raise ToolError(f"limit must be between 1 and {MAX_LIMIT}, got {limit}")
    session = await store.sessions.get(session_id)
    if session is None:
        raise ToolError(f"session {session_id} does not exist")
    hits = await store.history.search(session.thread_key, query, limit=limit)
    earlier = await store.history.search_sessions(session.thread_key, session.id, query, person=person, limit=limit)
    if not hits and not earlier:
        return (
            f"No earlier conversation (summarised, or in an earlier session) matches {query!r}. "
            "Everything newer is still in your context."
        )
    parts: list[str] = []
    if hits:
        parts.append(f"{len(hits)} match(es) in earlier, summarised conversation for {query!r}:")
        parts += [format_hit(i, hit) for i, hit in enumerate(hits, 1)]
    if earlier:
        parts.append(f"{len(earlier)} match(es) in earlier sessions for {query!r}:")
        parts += [format_session_hit(i, hit) for i, hit in enumerate(earlier, len(hits) + 1)]
    return "\n\n".join(parts)


def format_session_hit(number: int, hit: SessionHit) -> str:
    who = "you (the assistant)" if hit.role == "assistant" else (hit.sender_name or "the user")
    return (
        f"{number}. session {hit.session_id} (started {hit.session_started:%Y-%m-%d}), message #{hit.seq}, "
        f"{hit.at:%Y-%m-%d %H:%M} UTC, {who} said:\n   \"{hit.snippet}\""
    )


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
        """Search earlier conversation you no longer see, and quote it: what was summarised out of
        your context, and earlier sessions (before a /new) of this chat, and in a direct message
        the person's other direct-message sessions.

        Use it when the user refers to something discussed long ago that you no longer see.

        Args:
            query: words to look for, e.g. "postgres migration decision"
            limit: how many matches to return (1-20)
        """
        person = ctx.person.partition(":") if ctx.private and ctx.person else None
        return await history_search(
            store, ctx.session_id, query, limit, person=(person[0], person[2]) if person else None
        )

    return build_spec(history_search_tool, name="history_search")

