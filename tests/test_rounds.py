"""Rounds: a stream reassembled into one round (text, reasoning, tool calls), repetition cut."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.agent.messages import DeclaredCall
from gateway.agent.rounds import Round, RoundBuilder
from gateway.llm.events import Finish, ModelInfo, ReasoningDelta, TextDelta, ToolCallDelta, Usage

LOOP_BLOCK = "EXCLUSIVE OF THE EASTERLY 100 FEET\\nOF SAID LOTS 7 TO 10, EXCLUSIVE OF THE EASTERLY "


def build(events, **kwargs) -> Round:
    builder = RoundBuilder(**kwargs)
    for event in events:
        builder.feed(event)
    return builder.finish()


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
