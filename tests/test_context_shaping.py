"""Issue 3: budget, pristine tail, LOD, prefix stability, compaction, /compact, refusals."""

from __future__ import annotations

import json

import pytest
from test_context_support import (
    MODEL,
    Events,
    RecordingSummariser,
    build,
    builder,
    check_well_formed,
    exchange,
    history_of,
    reply,
    turn,
    user,
)

from gateway.context import CompactionError, make_budget
from gateway.store.history import HistoryRepo

TAIL = {"keep_messages": 2, "keep_tool_exchanges": 1}


async def open_session(store, key: str = "console:local:"):
    return await store.sessions.open(key, source="console")


async def grow(store, session, turns: int, result_chars: int = 300) -> int:
    first = 0
    for n in range(turns):
        first = await turn(store, session, n, result_chars)
    return first


async def full_estimate(store, session, first: int) -> int:
    return (await build(builder(store, 0), session, turn=first)).estimated_tokens


def tool_results(messages: list[dict]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool"}


def test_budget_reserve_headroom_and_unbudgeted():
    assert make_budget(0, 12, 10_000).unbudgeted
    budget = make_budget(100_000, 12, 10_000)
    assert (budget.budget, budget.target) == (88_000, 78_000)
    small = make_budget(10_000, 12, 10_000)  # headroom >= budget: shape at the full budget
    assert (small.budget, small.target) == (8_800, 8_800)
    assert make_budget(100_000, 12, 10_000, factor=1.5).tokens(300) == 150


async def test_unbudgeted_never_folds_or_truncates_however_long(store):
    session = await open_session(store)
    first = await grow(store, session, 60, result_chars=5_000)
    summariser = RecordingSummariser()
    b = builder(store, 0, summarise=summariser, **TAIL)
    b.correct_from_refusal(MODEL, 10, None, None)  # a refusal without numbers teaches no window
    built = await build(b, session, turn=first)
    assert summariser.requests == [] and built.folded == 0
    assert await HistoryRepo(store.db).compactions(session.id) == []
    results = tool_results(built.messages)
    assert len(results) == 60 and all("[truncated" not in r for r in results.values())


async def test_the_fold_happens_exactly_when_the_estimate_crosses_the_target(store):
    session = await open_session(store)
    first = await grow(store, session, 12)
    estimate = await full_estimate(store, session, first)
    summariser = RecordingSummariser()
    at_target = await build(builder(store, estimate, summarise=summariser, **TAIL), session, turn=first)
    assert at_target.folded == 0 and summariser.requests == [] and at_target.estimated_tokens == estimate
    over = await build(builder(store, estimate - 1, summarise=summariser, **TAIL), session, turn=first)
    assert over.folded > 0 and len(summariser.requests) >= 1
    # once shaping starts it goes down to the low water, however many folds that takes
    assert over.estimated_tokens <= make_budget(estimate - 1, 0, 0).low_water


async def test_pristine_tail_and_pinned_first_request_survive_folds(store):
    session = await open_session(store)
    first = await grow(store, session, 30)
    window = await full_estimate(store, session, first) // 3
    b = builder(
        store, window, summarise=RecordingSummariser(), pin_first_user=True, keep_messages=4, keep_tool_exchanges=2
    )
    built = await build(b, session, turn=first)
    assert built.folded > 0
    history = history_of(built.messages)
    # the pinned request first, then the summary of what was folded (one user message)
    assert history[0]["content"].startswith("request 0: please look at file 0\n\n[Summary of the earlier")
    contents = json.dumps(history)
    assert contents.count("request 0:") == 1
    for text in ("request 29", "answer 29", "answer 28", "<result 29>", "<result 28>"):
        assert text in contents
    assert "r" * 300 + "</result 29>" in contents  # verbatim, not stubbed
    markers = await HistoryRepo(store.db).compactions(session.id)
    assert markers[0].first_seq == 2  # the pinned row (seq 1) is never folded


async def test_lod_stubs_keep_the_end_each_tool_declares(store):
    session = await open_session(store)
    await user(store, session, "read three things")
    big = {"head_tool": "HEAD-START" + "h" * 3_000 + "HEAD-END", "tail_tool": "TAIL-START" + "t" * 3_000 + "TAIL-END",
           "both_tool": "BOTH-START" + "b" * 3_000 + "BOTH-END"}
    old = await exchange(store, session, *big.items())
    await reply(store, session, "read them")
    first = await grow(store, session, 6)
    window = await full_estimate(store, session, first) - 500
    b = builder(
        store, window, tool_lod={"tail_tool": "tail", "both_tool": "both"}, lod_above_chars=1_000, lod_step=1, **TAIL
    )
    built = await build(b, session, turn=first)
    assert built.folded == 0 and built.estimated_tokens <= window
    results = tool_results(built.messages)
    head, tail, both = (results[c.call_id] for c in old.tool_calls)
    for text in (head, tail, both):
        assert text.startswith("[truncated") and f"result of {len(big['head_tool'])} chars" in text
        assert "call the tool again" in text
    assert "HEAD-START" in head and "HEAD-END" not in head
    assert "TAIL-END" in tail and "TAIL-START" not in tail
    assert "BOTH-START" in both and "BOTH-END" in both and "elided" in both
    assert all("[truncated" not in r for k, r in results.items() if k not in {c.call_id for c in old.tool_calls})
    stored = await store.sessions.history(session.id)
    assert stored[1].tool_calls[0].result == big["head_tool"]  # render-time only


async def test_a_single_huge_result_is_capped_even_in_the_tail_when_budgeted(store):
    session = await open_session(store)
    request = await user(store, session, "dump it")
    await exchange(store, session, ("tail_tool", "A" * 5_000 + "LAST-LINE"))
    capped = await build(
        builder(store, 1_000_000, max_tool_result_chars=1_000, tool_lod={"tail_tool": "tail"}),
        session,
        turn=request.seq,
    )
    content = tool_results(capped.messages).popitem()[1]
    assert content.startswith("[truncated") and content.endswith("LAST-LINE") and len(content) < 1_200
    whole = await build(builder(store, 0, max_tool_result_chars=1_000), session, turn=request.seq)
    assert tool_results(whole.messages).popitem()[1].endswith("A" * 100 + "LAST-LINE")


async def test_between_lod_steps_the_prefix_of_a_growing_session_is_byte_identical(store):
    session = await open_session(store)
    b = builder(store, 12_000, lod_above_chars=500, lod_step=4, **TAIL)
    previous: list[dict] | None = None
    previous_stubbed: set[str] = set()
    steps = stable = 0
    for n in range(40):
        first = await turn(store, session, n, result_chars=1_500)
        built = await build(b, session, turn=first)
        check_well_formed(built.messages)
        stubbed = {k for k, v in tool_results(built.messages).items() if v.startswith("[truncated")}
        if previous is not None:
            if stubbed == previous_stubbed:
                prefix = previous[:-1]  # everything but the dynamic tail
                assert json.dumps(built.messages[: len(prefix)]) == json.dumps(prefix)
                stable += 1
            else:
                assert stubbed > previous_stubbed  # the boundary only moves forward
                assert len(stubbed - previous_stubbed) >= 2  # a whole batch at a step
                steps += 1
        previous, previous_stubbed = built.messages, stubbed
    assert 1 <= steps <= 5 and stable >= 30


async def test_folds_never_split_tool_pairs_and_markers_cover_the_right_range(store):
    session = await open_session(store)
    summariser, events = RecordingSummariser(), Events()
    b = builder(store, 3_000, summarise=summariser, on_event=events, **TAIL)
    for n in range(30):
        first = await turn(store, session, n, result_chars=600)
        built = await build(b, session, turn=first)
        check_well_formed(built.messages)
        assert built.estimated_tokens <= 3_000
    markers = await HistoryRepo(store.db).compactions(session.id)
    assert len(markers) >= 2
    assert markers[0].first_seq == 1
    for before, after in zip(markers, markers[1:], strict=False):
        assert after.first_seq == before.last_seq + 1
    stored = {m.seq: m for m in await store.sessions.history(session.id)}
    for marker in markers:
        for seq in range(marker.first_seq, marker.last_seq + 1):
            assert f"#{seq} " in marker.folded_text
            for call in stored[seq].tool_calls:
                assert call.result in marker.folded_text or call.result[:100] in marker.folded_text
    history = json.dumps(history_of(built.messages))
    last = markers[-1]
    for seq, row in stored.items():
        if row.content:
            assert (json.dumps(row.content) in history) == (seq > last.last_seq)
    assert markers[-1].summary in built.messages[1]["content"]  # where the folded rows stood
    assert built.messages[0]["content"] == "SYSTEM"
    # The summariser is given the task first, then the previous summary, then the events.
    request = summariser.requests[1][0][1]["content"]
    assert (
        request.index("SYSTEM")
        < request.index("request 0: please")
        < request.index("SUMMARY 1")
        < request.index("# Events")
    )
    kinds = [kind for kind, _ in events.seen if kind != "prefix_changed"]
    assert kinds == ["compaction_started", "compaction_finished"] * len(markers)
    changed = [p for k, p in events.seen if k == "prefix_changed" and p["reason"] == "fold"]
    assert sum(p["folds"] for p in changed) == len(markers)  # every fold is said to change the prefix
    finished = [p for k, p in events.seen if k == "compaction_finished"]
    assert all(
        p["tokens_after"] < p["tokens_before"] and p["entries_folded"] > 0 and "duration_ms" in p for p in finished
    )


async def test_at_most_max_folds_per_build(store):
    session = await open_session(store)
    first = await grow(store, session, 40)
    summariser = RecordingSummariser("S" * 30_000)  # a summary too long to ever fit
    b = builder(store, 2_000, summarise=summariser, max_folds_per_build=2, **TAIL)
    built = await build(b, session, turn=first)
    assert len(summariser.requests) == 2 and len(built.compactions) == 2
    assert len(await HistoryRepo(store.db).compactions(session.id)) == 2


async def test_a_failing_summariser_leaves_history_intact(store):
    session = await open_session(store)
    first = await grow(store, session, 20)
    events = Events()
    b = builder(store, 1_000, summarise=RecordingSummariser(fail=True), on_event=events, **TAIL)
    built = await build(b, session, turn=first)
    assert built.folded == 0 and await HistoryRepo(store.db).compactions(session.id) == []
    assert [k for k, _ in events.seen] == ["compaction_started", "compaction_finished", "prefix_changed"]
    assert events.seen[-1][1]["reason"] == "stubs"  # old results were stubbed; nothing was folded
    assert "summariser is down" in events.seen[1][1]["error"]
    check_well_formed(built.messages)


async def test_compact_now_folds_everything_before_the_tail_once(store):
    session = await open_session(store)
    first = await grow(store, session, 10)
    summariser = RecordingSummariser()
    b = builder(store, 0, summarise=summariser, **TAIL)
    before = await build(b, session, turn=first)
    result = await b.compact_now(session, system_prompt="SYSTEM")
    assert result is not None and result.reason == "manual"
    assert (result.first_seq, result.last_seq, result.entries_folded) == (
        1,
        first - 1,
        first - 1,
    )  # all before the last turn
    assert result.tokens_after < result.tokens_before
    after = await build(b, session, turn=first)
    assert "SUMMARY 1" in after.messages[1]["content"]
    assert len(after.messages) < len(before.messages)
    assert await b.compact_now(session, system_prompt="SYSTEM") is None  # nothing left to fold
    with pytest.raises(CompactionError):
        await builder(store, 0).compact_now(session, system_prompt="SYSTEM")


async def test_compact_now_reports_a_failing_summariser(store):
    session = await open_session(store)
    await grow(store, session, 6)
    with pytest.raises(CompactionError, match="summariser is down"):
        await builder(store, 0, summarise=RecordingSummariser(fail=True), **TAIL).compact_now(
            session, system_prompt="S"
        )
    assert await HistoryRepo(store.db).compactions(session.id) == []


async def test_a_refusal_shrinks_the_next_build(store):
    session = await open_session(store)
    first = await grow(store, session, 20, result_chars=3_000)
    window = await full_estimate(store, session, first) + 100
    b = builder(store, window, summarise=RecordingSummariser(), **TAIL)
    sent = await build(b, session, turn=first)
    assert sent.folded == 0 and "[truncated" not in json.dumps(sent.messages)
    b.correct_from_refusal(MODEL, sent.estimated_tokens, int(sent.estimated_tokens * 1.5), window)
    again = await build(b, session, turn=first)
    assert len(json.dumps(again.messages)) < len(json.dumps(sent.messages))
    assert again.estimated_tokens <= again.target
    assert b.budget(MODEL).factor == int(sent.estimated_tokens * 1.5) / sent.estimated_tokens


async def test_a_refusal_naming_the_window_budgets_an_unbudgeted_model(store):
    session = await open_session(store)
    first = await grow(store, session, 20, result_chars=3_000)
    b = builder(store, 0, summarise=RecordingSummariser(), **TAIL)
    sent = await build(b, session, turn=first)
    b.correct_from_refusal(MODEL, sent.estimated_tokens, sent.estimated_tokens, sent.estimated_tokens // 2)
    again = await build(b, session, turn=first)
    assert again.estimated_tokens <= sent.estimated_tokens // 2


async def test_reported_usage_corrects_the_estimate_upwards_only(store):
    session = await open_session(store)
    first = await grow(store, session, 3)
    b = builder(store, 0)
    plain = (await build(b, session, turn=first)).estimated_tokens
    b.observe_usage(MODEL, plain, plain * 2)
    assert (await build(b, session, turn=first)).estimated_tokens in (plain * 2, plain * 2 + 1)
    for _ in range(100):
        b.observe_usage(MODEL, plain, 1)  # a provider reporting less never takes the factor below 1
    assert (await build(b, session, turn=first)).estimated_tokens == plain


async def test_the_context_built_round_after_round_equals_one_built_from_scratch(store):
    """Each build extends the previous turn's assembly: rows before the new turn render alike, so
    only the turn's own rows are rendered again. Whatever the mix of rows, the result must be
    what a fresh builder (nothing cached) assembles."""
    session = await open_session(store)
    warm = builder(store, 0, hide_above=50)  # results of earlier turns render differently: hidden
    for n in range(12):
        first = (await user(store, session, f"request {n}")).seq
        if n % 3 == 0:
            await user(store, session, f"and one more thing about {n}")  # merged with the request
        for _ in range(n % 3):  # rounds of one turn: the same turn_seq, history growing
            await exchange(store, session, ("read_file", f"result {n} " + "x" * 60))
            built = await build(warm, session, turn=first)
            assert built.messages == (await build(builder(store, 0, hide_above=50), session, turn=first)).messages
        await reply(store, session, f"answer {n}")
        built = await build(warm, session, turn=first)
        assert built.messages == (await build(builder(store, 0, hide_above=50), session, turn=first)).messages
        check_well_formed(built.messages)


async def test_no_fold_between_the_tool_rounds_of_a_turn_while_the_request_fits(store):
    """Over the target but within the budget between two tool rounds: the request goes as it
    is (its prefix is what the provider cached a moment ago); the next turn's first round
    folds, down to the low water, so the prefix then grows untouched for a while."""
    session = await open_session(store)
    await grow(store, session, 12)
    started = (await user(store, session, "request 12: please look at every file")).seq
    await exchange(store, session, ("read_file", "r" * 900))  # the turn's first tool round
    mid = await full_estimate(store, session, started)
    summariser, events = RecordingSummariser(), Events()
    window, headroom = mid + 300, 600  # the target is under this request, the budget above it
    b = builder(store, window, summarise=summariser, on_event=events, headroom_tokens=headroom, **TAIL)
    first_round = await build(b, session, turn=started)
    assert first_round.folded == 0 and summariser.requests == [] and events.seen == []
    assert first_round.estimated_tokens > first_round.target  # shaped only where it would not fit
    await reply(store, session, "answer 12: all fine")
    next_turn = (await user(store, session, "request 13: and now?")).seq
    built = await build(b, session, turn=next_turn)
    assert built.folded > 0 and len(summariser.requests) >= 1
    budget = make_budget(window, 0, headroom)
    assert built.estimated_tokens <= budget.low_water < budget.target
    (changed,) = [p for kind, p in events.seen if kind == "prefix_changed"]
    assert changed["reason"] == "fold" and changed["tokens_after"] == built.estimated_tokens


async def test_a_request_that_would_not_fit_is_shaped_even_between_tool_rounds(store):
    session = await open_session(store)
    await grow(store, session, 12)
    started = (await user(store, session, "request 12: please look at every file")).seq
    await exchange(store, session, ("read_file", "r" * 900))
    mid = await full_estimate(store, session, started)
    summariser = RecordingSummariser()
    b = builder(store, mid - 100, summarise=summariser, headroom_tokens=600, **TAIL)
    built = await build(b, session, turn=started)
    assert built.folded > 0 and built.estimated_tokens <= mid - 100
    check_well_formed(built.messages)


async def test_stubs_change_only_when_shaping_starts(store):
    """Level of detail moves with a reshaping only: rounds that fit keep the stubs they had."""
    session = await open_session(store)
    await grow(store, session, 10, result_chars=5_000)
    first = (await user(store, session, "request 10: one more")).seq
    estimate = await full_estimate(store, session, first)
    events = Events()
    b = builder(store, estimate + 2_000, headroom_tokens=2_500, on_event=events, **TAIL)  # over target: stubs
    shaped = await build(b, session, turn=first)
    stubbed = [r for r in tool_results(shaped.messages).values() if "[truncated" in r]
    assert stubbed and [k for k, _ in events.seen] == ["prefix_changed"]
    await exchange(store, session, ("read_file", "x" * 5_000))
    mid = await build(b, session, turn=first)  # the next round: fits, nothing moves
    await reply(store, session, "answer 10")
    nxt = (await user(store, session, "request 11: and this")).seq
    again = await build(b, session, turn=nxt)
    assert len(events.seen) == 1  # no other change of the prefix
    for earlier, later in ((shaped, mid), (mid, again)):
        before, after = history_of(earlier.messages), history_of(later.messages)
        assert after[: len(before) - 1] == before[:-1]  # the same stubs, the same bytes: only appended
        assert after[len(before) - 1]["content"].startswith(before[-1]["content"])


async def test_a_tail_too_large_for_the_low_water_has_its_earlier_turns_stubbed_never_the_current(store):
    session = await open_session(store)
    await grow(store, session, 6, result_chars=5_000)
    started = (await user(store, session, "request 6: and this one")).seq
    await exchange(store, session, ("read_file", "CURRENT" + "c" * 5_000))
    window = await full_estimate(store, session, started) - 100  # over the budget, even mid-turn
    built = await build(builder(store, window, keep_messages=8, keep_tool_exchanges=4), session, turn=started)
    results = list(tool_results(built.messages).values())
    assert results[-1] == "CURRENT" + "c" * 5_000  # the current turn's result, whole
    assert all("[truncated" in r for r in results[:-1])  # the earlier turns' ones, tail included
