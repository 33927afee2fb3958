"""Rounds: stream reassembly, result pairing, placeholders, supersede and stitching."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.agent.rounds import (
    DeclaredCall,
    FirstError,
    Round,
    RoundBuilder,
    RoundResults,
    ToolResult,
    TurnRounds,
)
from gateway.llm.events import Finish, ModelInfo, ReasoningDelta, TextDelta, ToolCallDelta, Usage

LOOP_BLOCK = "EXCLUSIVE OF THE EASTERLY 100 FEET\\nOF SAID LOTS 7 TO 10, EXCLUSIVE OF THE EASTERLY "


def build(events, **kwargs) -> Round:
    builder = RoundBuilder(**kwargs)
    for event in events:
        builder.feed(event)
    return builder.finish()


def round_with(*ids: str) -> Round:
    calls = tuple(DeclaredCall(i, f"tool_{i}", "{}") for i in ids)
    return Round("", "", calls, "tool_calls")


# --- reassembly -------------------------------------------------------------------------------


def test_split_tool_calls_reassemble_in_declared_order():
    events = [
        ModelInfo("main-model", served="main-model-2026", attempts=2),
        ReasoningDelta("Need two "),
        ReasoningDelta("files."),
        TextDelta("Reading "),
        TextDelta("both."),
        ToolCallDelta(0, id="call_a", name="read_file", arguments='{"pa'),
        ToolCallDelta(1, id="call_b", name="list_dir", arguments=""),
        ToolCallDelta(0, arguments='th": "a.txt"}'),
        ToolCallDelta(1, arguments='{"path": "."}'),
        Finish("tool_calls"),
        Usage(prompt_tokens=120, completion_tokens=30, cached_tokens=100),
    ]
    result = build(events)
    assert result.text == "Reading both."
    assert result.reasoning == "Need two files."
    assert result.calls == (
        DeclaredCall("call_a", "read_file", '{"path": "a.txt"}'),
        DeclaredCall("call_b", "list_dir", '{"path": "."}'),
    )
    assert result.finish_reason == "tool_calls"
    assert result.model == "main-model"
    assert result.usage == Usage(prompt_tokens=120, completion_tokens=30, cached_tokens=100)
    assert not result.cut_off


def test_provider_repeating_id_and_name_on_every_fragment():
    events = [
        ToolCallDelta(0, id="c1", name="shell", arguments='{"cmd":'),
        ToolCallDelta(0, id="c1", name="shell", arguments=' "ls'),
        ToolCallDelta(0, id="c1", name="shell", arguments=' -la"}'),
    ]
    assert build(events).calls == (DeclaredCall("c1", "shell", '{"cmd": "ls -la"}'),)


def test_index_gaps_and_out_of_order_indexes_keep_declared_order():
    events = [
        ToolCallDelta(2, id="late", name="b", arguments="{}"),
        ToolCallDelta(0, id="first", name="a", arguments="{}"),
        ToolCallDelta(5, id="last", name="c", arguments="{}"),
    ]
    assert [c.id for c in build(events).calls] == ["first", "late", "last"]


def test_reused_index_with_a_new_id_is_a_new_call():
    events = [
        ToolCallDelta(0, id="x1", name="clock", arguments="{}"),
        ToolCallDelta(0, id="x2", name="clock", arguments='{"tz": "UTC"}'),
    ]
    calls = build(events).calls
    assert [(c.id, c.arguments) for c in calls] == [("x1", "{}"), ("x2", '{"tz": "UTC"}')]


def test_missing_ids_are_synthesised_deterministically_and_uniquely():
    events = [
        ToolCallDelta(0, name="a", arguments="{}"),
        ToolCallDelta(1, id="call_1", name="b", arguments="{}"),
        ToolCallDelta(2, name="c", arguments="{}"),
    ]
    first = build(events)
    again = build(events)
    ids = [c.id for c in first.calls]
    assert ids == [c.id for c in again.calls]
    assert len(set(ids)) == 3
    assert ids[1] == "call_1"  # a provider id is kept even when it looks synthetic
    assert ids[0].startswith("call_") and ids[2].startswith("call_")


def test_same_id_on_two_indexes_is_made_unique():
    events = [
        ToolCallDelta(0, id="dup", name="a", arguments="{}"),
        ToolCallDelta(1, id="dup", name="b", arguments="{}"),
    ]
    ids = [c.id for c in build(events, id_prefix="r7").calls]
    assert ids[0] == "dup" and ids[1] != "dup" and ids[1].startswith("r7_")


def test_fragmented_name_is_joined():
    events = [ToolCallDelta(0, id="c", name="read_"), ToolCallDelta(0, name="file", arguments="{}")]
    assert build(events).calls[0].name == "read_file"


def test_draft_shows_partial_output_mid_stream():
    builder = RoundBuilder()
    builder.feed(TextDelta("Let me"))
    builder.feed(ToolCallDelta(0, id="c", name="shell", arguments='{"cmd": "l'))
    draft = builder.draft()
    assert draft.text == "Let me"
    assert draft.calls == (DeclaredCall("c", "shell", '{"cmd": "l'),)


def test_length_finish_marks_round_cut_off():
    events = [ToolCallDelta(0, id="c", name="write_file", arguments='{"content": "abc'),
              Finish("length")]
    assert build(events).cut_off


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_reassembly_does_not_depend_on_fragmenting(data):
    args = data.draw(st.lists(st.text(max_size=40), min_size=1, max_size=3))
    text = data.draw(st.text(max_size=60))
    events = [TextDelta(p) for p in _split(data, text)]
    for index, arg in enumerate(args):
        pieces = _split(data, arg)
        events.append(ToolCallDelta(index, id=f"id{index}", name=f"t{index}",
                                    arguments=pieces[0]))
        events += [ToolCallDelta(index, arguments=p) for p in pieces[1:]]
    result = build(events, guard_repetition=False)
    assert result.text == text
    assert [c.arguments for c in result.calls] == args
    assert [c.id for c in result.calls] == [f"id{i}" for i in range(len(args))]


def _split(data, text: str) -> list[str]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=4)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


# --- repetition inside the builder ------------------------------------------------------------


def test_text_loop_is_cut_and_trimmed_to_one_copy():
    builder = RoundBuilder()
    builder.feed(TextDelta("The parcel is described as:\n"))
    cut = None
    for _ in range(200):
        cut = builder.feed(TextDelta(LOOP_BLOCK))
        if cut:
            break
    assert cut is not None and cut.where == "text" and cut.period == len(LOOP_BLOCK)
    assert builder.feed(TextDelta(LOOP_BLOCK)) is None  # nothing after the cut is kept
    result = builder.finish()
    assert result.repetition == cut
    assert result.text == "The parcel is described as:\n" + LOOP_BLOCK
    assert result.finish_reason is None


def test_argument_loop_drops_the_looping_call_and_keeps_earlier_ones():
    builder = RoundBuilder()
    builder.feed(ToolCallDelta(0, id="ok", name="clock", arguments="{}"))
    builder.feed(ToolCallDelta(1, id="bad", name="record", arguments='{"text": "'))
    cut = None
    for _ in range(200):
        cut = builder.feed(ToolCallDelta(1, arguments=LOOP_BLOCK))
        if cut:
            break
    assert cut is not None and cut.where == "arguments"
    assert cut.kept == '{"text": "' + LOOP_BLOCK
    result = builder.finish()
    assert [c.id for c in result.calls] == ["ok"]


def test_reasoning_loop_is_trimmed():
    builder = RoundBuilder()
    for _ in range(200):
        if builder.feed(ReasoningDelta(LOOP_BLOCK)):
            break
    result = builder.finish()
    assert result.repetition is not None and result.reasoning == LOOP_BLOCK


# --- pairing ----------------------------------------------------------------------------------


def test_results_come_out_in_declared_order_whatever_the_arrival_order():
    results = RoundResults(round_with("a", "b", "c"))
    assert results.add_result("c", "three").kind == "accepted"
    assert results.add_result("a", "one").kind == "accepted"
    assert results.add_result("b", "two").kind == "complete"
    flushed = results.flush()
    assert [(r.call_id, r.text) for r in flushed.results] == [
        ("a", "one"), ("b", "two"), ("c", "three")]
    assert flushed.reason is None


@pytest.mark.parametrize("reason", ["canceled", "interrupted", "superseded"])
def test_missing_results_get_a_placeholder_naming_the_reason(reason):
    results = RoundResults(round_with("a", "b", "c"))
    results.add_result("b", "done")
    flushed = results.flush(reason)
    assert [r.text for r in flushed.results] == [
        f"[placeholder] {reason}", "done", f"[placeholder] {reason}"]
    assert [r.status for r in flushed.results] == ["placeholder", "ok", "placeholder"]
    assert flushed.reason == reason


def test_failed_results_are_prefixed():
    results = RoundResults(round_with("a"))
    outcome = results.add_result("a", "permission denied", failed=True)
    assert outcome.result == ToolResult("a", "tool_a", "[failed] permission denied", "failed")
    assert results.flush().results[0].text == "[failed] permission denied"


def test_unknown_and_duplicate_results_are_dropped_first_wins():
    results = RoundResults(round_with("a", "b"))
    assert results.add_result("zzz", "stray").kind == "unknown"
    assert results.add_result("a", "first").kind == "accepted"
    duplicate = results.add_result("a", "second")
    assert duplicate.kind == "duplicate" and duplicate.dropped
    assert not results.complete  # a duplicate must not complete the round early
    results.add_result("b", "b")
    assert [r.text for r in results.flush().results] == ["first", "b"]


def test_flush_with_open_calls_needs_a_reason():
    with pytest.raises(ValueError, match="a"):
        RoundResults(round_with("a")).flush()


def test_late_result_stitches_over_a_superseded_placeholder_only():
    results = RoundResults(round_with("a", "b"))
    results.flush("superseded")
    stitched = results.add_result("b", "late answer")
    assert stitched.kind == "stitched"
    assert stitched.result == ToolResult("b", "tool_b", "late answer", "ok")
    assert [r.text for r in results.flush().results] == ["[placeholder] superseded",
                                                          "late answer"]
    assert results.add_result("b", "again").kind == "duplicate"


def test_late_result_after_cancel_is_dropped():
    results = RoundResults(round_with("a"))
    results.flush("canceled")
    outcome = results.add_result("a", "too late")
    assert outcome.kind == "closed" and outcome.dropped
    assert results.flush().results[0].text == "[placeholder] canceled"


@settings(max_examples=80, deadline=None)
@given(
    n=st.integers(1, 6),
    order=st.permutations(range(6)),
    answered=st.integers(0, 6),
    reason=st.sampled_from(["canceled", "interrupted", "superseded"]),
)
def test_flush_pairs_every_call_exactly_once(n, order, answered, reason):
    ids = [f"c{i}" for i in range(n)]
    results = RoundResults(round_with(*ids))
    arrived = [ids[i] for i in order if i < n][:answered]
    for call_id in arrived:
        results.add_result(call_id, f"result of {call_id}")
    flushed = results.flush(reason)
    assert [r.call_id for r in flushed.results] == ids
    for r in flushed.results:
        expected = f"result of {r.call_id}" if r.call_id in arrived else f"[placeholder] {reason}"
        assert r.text == expected


# --- a turn's rounds --------------------------------------------------------------------------


def test_new_output_while_calls_are_open_supersedes_and_late_results_stitch():
    turn = TurnRounds()
    assert turn.add_round(round_with("a", "b")) == []
    turn.add_result("a", "A")
    superseded = turn.on_output(TextDelta("Meanwhile..."))
    assert superseded is not None and superseded.reason == "superseded"
    assert [r.text for r in superseded.results] == ["A", "[placeholder] superseded"]
    assert turn.on_output(TextDelta("more")) is None  # nothing open any more
    outcome, flushed = turn.add_result("b", "B")
    assert outcome.kind == "stitched" and outcome.result.text == "B" and flushed is None


def test_empty_text_delta_does_not_supersede():
    turn = TurnRounds()
    turn.add_round(round_with("a"))
    assert turn.on_output(TextDelta("")) is None
    assert turn.on_output(ToolCallDelta(0, id="x")) is None
    assert turn.open_round is not None


def test_last_result_flushes_the_round_and_text_rounds_flush_at_once():
    turn = TurnRounds()
    turn.add_round(round_with("a", "b"))
    assert turn.add_result("b", "B")[1] is None
    outcome, flushed = turn.add_result("a", "A")
    assert outcome.kind == "complete"
    assert [r.text for r in flushed.results] == ["A", "B"]
    reply = Round("All done.", "", (), "stop")
    [text_round] = turn.add_round(reply)
    assert text_round.round == reply and text_round.results == () and turn.open_round is None


def test_a_round_added_while_another_is_open_supersedes_it():
    turn = TurnRounds()
    turn.add_round(round_with("a"))
    flushed = turn.add_round(round_with("b"))
    assert len(flushed) == 1 and flushed[0].results[0].text == "[placeholder] superseded"
    assert turn.open_round is not None and turn.open_round.declares("b")


@pytest.mark.parametrize("reason", ["canceled", "interrupted"])
def test_close_flushes_the_open_round_with_the_turn_end_reason(reason):
    turn = TurnRounds()
    turn.add_round(round_with("a", "b"))
    turn.add_result("a", "A")
    flushed = turn.close(reason)
    assert [r.text for r in flushed.results] == ["A", f"[placeholder] {reason}"]
    assert turn.close(reason) is None
    outcome, _ = turn.add_result("b", "late")
    assert outcome.kind == "closed"


def test_unknown_result_in_a_turn_is_dropped():
    turn = TurnRounds()
    turn.add_round(round_with("a"))
    outcome, flushed = turn.add_result("nope", "x")
    assert outcome.kind == "unknown" and flushed is None
    assert turn.open_round is not None and not turn.open_round.complete


def test_builders_of_one_turn_synthesise_distinct_ids():
    turn = TurnRounds(id_prefix="run9")
    ids = []
    for _ in range(2):
        builder = turn.new_builder()
        builder.feed(ToolCallDelta(0, name="clock", arguments="{}"))
        ids.append(builder.finish().calls[0].id)
    assert ids[0] != ids[1] and all(i.startswith("run9_") for i in ids)


def test_first_persistence_error_is_reported_only_without_a_turn_error():
    errors = FirstError()
    errors.record(None)
    first, second = OSError("disk full"), TimeoutError("lock")
    errors.record(first)
    errors.record(second)
    assert errors.reported(None) is first
    turn_error = RuntimeError("stream broke")
    assert errors.reported(turn_error) is turn_error
    assert FirstError().reported(None) is None
