"""Folded history stays findable: FTS over compactions and the `history_search` tool."""

from __future__ import annotations

from datetime import UTC, datetime

from test_context_support import RecordingSummariser, builder, reply, turn, user

from gateway.config import AgentConfig
from gateway.context import history_search_spec
from gateway.events import ThreadKey
from gateway.store.history import HistoryRepo
from gateway.tools import InMemoryNotes, ToolContext, ToolRegistry, run_tool

TAIL = {"keep_messages": 2, "keep_tool_exchanges": 1}


async def folded_session(store, thread: ThreadKey, fact: str):
    session = await store.sessions.open(str(thread), source="console")
    await user(store, session, "which database should the gateway use?")
    await reply(store, session, fact)
    for n in range(4):
        await turn(store, session, n)
    result = await builder(store, 0, summarise=RecordingSummariser(), **TAIL).compact_now(
        session, system_prompt="SYSTEM"
    )
    assert result is not None and result.first_seq == 1
    return session


def tool_context(session, thread: ThreadKey, tmp_path) -> ToolContext:
    return ToolContext(session.id, thread, "console", True, tmp_path, AgentConfig(), InMemoryNotes())


async def test_history_search_finds_and_quotes_a_folded_fact(store, tmp_path):
    thread = ThreadKey("telegram", "42")
    session = await folded_session(store, thread, "We decided on PostgreSQL because LISTEN/NOTIFY wakes the workers.")
    registry = ToolRegistry([history_search_spec(store)])
    spec = registry.get("history_search")
    outcome = await run_tool(spec, {"query": "postgresql notify"}, tool_context(session, thread, tmp_path))
    assert not outcome.failed
    assert "«PostgreSQL»" in outcome.text and "#1–#" in outcome.text
    assert f"{datetime.now(UTC):%Y-%m-%d}" in outcome.text
    # Natural-language questions fall back to any-word matching.
    outcome = await run_tool(
        spec, {"query": "what did we decide about the database?", "limit": 1}, tool_context(session, thread, tmp_path)
    )
    assert "PostgreSQL" in outcome.text


async def test_history_search_stays_inside_the_thread(store, tmp_path):
    mine, other = ThreadKey("telegram", "1"), ThreadKey("slack", "C9", "1.0")
    session = await folded_session(store, mine, "The release is called Aurora.")
    await folded_session(store, other, "The secret codename is Aurora too.")
    hits = await HistoryRepo(store.db).search(str(mine), "aurora", limit=5)
    assert [h.session_id for h in hits] == [session.id]
    assert "«Aurora»" in hits[0].snippet and hits[0].first_seq == 1 and hits[0].summary.startswith("SUMMARY")


async def test_history_search_answers_bad_input_clearly(store, tmp_path):
    thread = ThreadKey("telegram", "7")
    session = await folded_session(store, thread, "Nothing of note.")
    spec = history_search_spec(store)
    ctx = tool_context(session, thread, tmp_path)
    empty = await run_tool(spec, {"query": "?!"}, ctx)
    assert empty.failed and "at least one word" in empty.text
    too_many = await run_tool(spec, {"query": "note", "limit": 0}, ctx)
    assert too_many.failed and "between 1 and 20" in too_many.text
    nothing = await run_tool(spec, {"query": "zeppelin"}, ctx)
    assert not nothing.failed and nothing.text.startswith("No earlier")
    injection = await run_tool(spec, {"query": 'note" OR * NEAR(' }, ctx)
    assert not injection.failed
