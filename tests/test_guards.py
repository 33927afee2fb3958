"""Guards: repetition cut, repetition streak, tool-loop, length, and tool-argument checks."""

from __future__ import annotations

import json
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

from gateway.agent.arguments import ArgumentsOk, ArgumentsProblem, check_arguments
from gateway.agent.guards import (
    TOOL_LOOP_NOTICE,
    LengthGuard,
    RepetitionGuard,
    RepetitionStreak,
    ToolLoopGuard,
)
from gateway.agent.messages import DeclaredCall, ToolResult

LOOP_BLOCK = "EXCLUSIVE OF THE EASTERLY 100 FEET\\nOF SAID LOTS 7 TO 10, EXCLUSIVE OF THE EASTERLY "

PROSE = """\
The gateway keeps every inbound event in the database before it tells the platform the event
was received. If the process stops between the two steps, the platform sends the event again
and the unique key on its id turns the second insert into a no-op. That is the whole trick,
and it is why a restart never loses a message: nothing lives only in memory.

Workers take a lease on a thread before they read its inbox. The lease row carries a fencing
token, so a worker that was paused for a long time (a garbage collection, a laptop lid) cannot
overwrite the progress of the worker that took over. When a turn needs an approval it parks:
the prompt is saved, the buttons are sent, and the lease is released.
"""

CODE = '''\
def render_rows(rows: list[dict[str, str]]) -> str:
    out = []
    for row in rows:
        out.append(f"| {row['name']} | {row['status']} | {row['updated']} |")
    return "\\n".join(out)


class Backoff:
    def __init__(self, base: float = 0.5, cap: float = 30.0) -> None:
        self.base = base
        self.cap = cap
        self.attempt = 0

    def next_delay(self) -> float:
        self.attempt += 1
        return min(self.cap, self.base * 2 ** self.attempt)
'''


def feed_all(text: str, chunk: int = 7, guard: RepetitionGuard | None = None):
    guard = guard or RepetitionGuard()
    for i in range(0, len(text), chunk):
        cut = guard.feed(text[i:i + chunk])
        if cut:
            return cut
    return None


def markdown_table(rows: int) -> str:
    lines = ["| service | status | last check | note |", "| --- | --- | --- | --- |"]
    lines += [f"| worker-{i:03d} | ok | 2026-07-{1 + i % 28:02d} 12:00 | lease renewed |"
              for i in range(rows)]
    return "\n".join(lines) + "\n"


# --- repetition -------------------------------------------------------------------------------


def test_a_looping_block_is_cut_early_with_its_true_period():
    prefix = "Legal description follows.\n"
    cut = feed_all(prefix + LOOP_BLOCK * 200, chunk=13)
    assert cut is not None
    assert cut.period == len(LOOP_BLOCK)
    assert cut.copies >= 3 and cut.copies * cut.period >= 512
    assert cut.copies * cut.period <= 1024  # cut within the first kilobyte of the loop
    assert cut.kept == prefix + LOOP_BLOCK
    assert cut.sample == LOOP_BLOCK


def test_kept_text_holds_exactly_one_copy_whatever_the_phase():
    for prefix in ["", "x", "Some words. ", "EASTERLY "]:
        cut = feed_all(prefix + LOOP_BLOCK * 40)
        assert cut is not None
        assert (prefix + LOOP_BLOCK).startswith(cut.kept)
        assert len(cut.kept) >= len(prefix + LOOP_BLOCK) - len(LOOP_BLOCK)
        assert cut.kept.count("100 FEET") == 1


def test_three_copies_over_512_bytes_trip_and_two_do_not():
    # The tail is scanned every 64 bytes, so a loop is caught at most 64 bytes after its third
    # copy completes, as long as it keeps going (a runaway loop always does).
    block = "".join(f"step {i}: move the cursor right; " for i in range(7))  # ~220 bytes
    assert 200 < len(block) < 1024
    assert feed_all("Intro.\n" + block * 2 + block[:100] + "Then done, nothing more.") is None
    cut = feed_all("Intro.\n" + block * 3 + block[:64])
    assert cut is not None and cut.period == len(block) and cut.copies == 3


def test_short_cycles_and_very_long_blocks_are_not_loops():
    assert feed_all("ab" * 4000) is None  # period 2 < 24, at any length
    assert feed_all("word " * 2000) is None  # period 5
    assert feed_all(("abcdefghij" * 2 + "xyz") * 100) is None  # period 23
    long_block = "".join(f"line {i} of a long generated section\n" for i in range(40))
    assert len(long_block) > 1024
    assert feed_all(long_block * 3) is None


def test_small_copies_need_the_512_byte_span():
    block = "the same sentence again!"  # 24 bytes
    assert feed_all("x" + block * 20) is None  # 480 bytes
    assert feed_all("x" + block * 30) is not None  # 720 bytes


def test_multibyte_text_loops_are_cut_on_character_boundaries():
    block = "Повторяю ещё раз одно и то же 🔁 "
    cut = feed_all("Начало.\n" + block * 60, chunk=3)
    assert cut is not None and cut.kept == "Начало.\n" + block


@pytest.mark.parametrize("text", [
    PROSE * 1,
    CODE,
    markdown_table(120),
    "| --- | --- | --- |\n" * 300,
    "\n" * 4000,
    "\t\t\t\t" * 2000,
    "".join(f"- item {i}: checked, nothing to report\n" for i in range(300)),
    "".join(f"EXCLUSIVE OF THE EASTERLY 100 FEET OF SAID LOTS {i} TO {i + 3};\n"
            "together with the appurtenances thereto, situate in the County of Record.\n"
            for i in range(150)),
])
def test_no_false_positives_on_ordinary_output(text):
    assert feed_all(text) is None
    assert feed_all(text, chunk=1) is None


WORDS = ("the a gateway thread lease token worker message event inbox turn round tool call "
         "result user reply stream text model approval button prompt database row key restart "
         "process platform is was and or but when then if it that this to of in on for with "
         "| - * 1 2 3 42 2026 ok error retry").split()


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(st.sampled_from(WORDS), min_size=200, max_size=700),
    seps=st.lists(st.sampled_from([" ", " ", " ", ", ", ". ", "\n", "\n\n", " | "]),
                  min_size=1, max_size=50),
    chunk=st.integers(1, 40),
)
def test_prose_like_random_text_never_trips(words, seps, chunk):
    text = "".join(w + seps[i % len(seps)] for i, w in enumerate(words))
    assert feed_all(text, chunk=chunk) is None


@settings(max_examples=40, deadline=None)
@given(
    block=st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=0x24F), min_size=30,
                  max_size=120),
    chunk=st.integers(1, 50),
)
def test_detection_does_not_depend_on_chunking(block, chunk):
    text = "Start:\n" + block * 30
    whole = feed_all(text, chunk=len(text))
    chunked = feed_all(text, chunk=chunk)
    assert whole == chunked
    if len(block.encode()) >= 24 and whole is None:
        # Only a block built from a shorter cycle may escape (formatting, not a loop).
        encoded = block.encode()
        assert any(encoded == encoded[:d] * (len(encoded) // d) for d in range(1, 24))


def test_guard_reports_once_and_tool_argument_streams_are_watched():
    guard = RepetitionGuard("arguments")
    guard.feed('{"text": "')
    cuts = [guard.feed(LOOP_BLOCK) for _ in range(50)]
    found = [c for c in cuts if c is not None]
    assert len(found) == 1 and found[0].where == "arguments"
    assert found[0].kept == '{"text": "' + LOOP_BLOCK


def test_repetition_streak_ends_the_turn_after_more_than_two_cuts():
    streak = RepetitionStreak()
    assert [streak.record(True), streak.record(True)] == ["reprompt", "reprompt"]
    assert streak.record(False) == "ok"  # a clean round resets the streak
    assert [streak.record(True) for _ in range(3)] == ["reprompt", "reprompt", "repetition"]


# --- tool loop --------------------------------------------------------------------------------


def tool_round(n: int, args: str, result: str) -> tuple[list[DeclaredCall], list[ToolResult]]:
    call = DeclaredCall(f"call_{n}", "http_fetch", args)
    return [call], [ToolResult(call.id, call.name, result, "ok")]


def test_identical_rounds_give_a_notice_at_5_and_stop_at_10():
    guard = ToolLoopGuard()
    verdicts = [guard.record(*tool_round(n, '{"url": "https://x"}', "same page"))
                for n in range(10)]
    assert verdicts == ["ok"] * 4 + ["notice"] + ["ok"] * 4 + ["stop"]
    assert TOOL_LOOP_NOTICE.startswith("[tool_loop]")


def test_a_poll_whose_result_changes_never_trips():
    guard = ToolLoopGuard()
    verdicts = [guard.record(*tool_round(n, '{"job": 7}', f"status: running, {n}% done"))
                for n in range(40)]
    assert set(verdicts) == {"ok"}


def test_argument_formatting_and_call_ids_do_not_hide_a_loop():
    guard = ToolLoopGuard(notice_at=2, stop_at=3)
    assert guard.record(*tool_round(1, '{"a": 1, "b": [1, 2]}', "r")) == "ok"
    assert guard.record(*tool_round(2, '{"b":[1,2],"a":1}', "r")) == "notice"
    assert guard.record(*tool_round(3, '{ "a" : 1 , "b" : [1,2] }', "r")) == "stop"


def test_a_different_round_or_a_text_round_resets_the_streak():
    guard = ToolLoopGuard(notice_at=3, stop_at=4)
    same = tool_round(0, "{}", "r")
    assert [guard.record(*same), guard.record(*same)] == ["ok", "ok"]
    assert guard.record(*tool_round(0, '{"other": 1}', "r")) == "ok"
    assert [guard.record(*same), guard.record(*same)] == ["ok", "ok"]
    assert guard.record([], []) == "ok"
    assert [guard.record(*same) for _ in range(4)] == ["ok", "ok", "notice", "stop"]


# --- length -----------------------------------------------------------------------------------


def test_length_cut_reprompts_twice_then_overflows():
    guard = LengthGuard()
    assert [guard.record("length"), guard.record("length")] == ["reprompt", "reprompt"]
    assert guard.record("length") == "overflow"
    fresh = LengthGuard()
    assert [fresh.record("length"), fresh.record("stop"), fresh.record("length"),
            fresh.record("length")] == ["reprompt", "ok", "reprompt", "reprompt"]


# --- argument checks --------------------------------------------------------------------------


class WriteFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    content: str
    mode: Literal["overwrite", "append"] = "overwrite"
    line: int | None = None
    ratio: float = 1.0
    dry_run: bool = False
    tags: list[str] = []
    meta: dict[str, str] = {}


SCHEMA = WriteFile.model_json_schema()


def problem(raw: str, *, cut_off: bool = False) -> ArgumentsProblem:
    result = check_arguments(raw, SCHEMA, cut_off=cut_off, tool_name="write_file")
    assert isinstance(result, ArgumentsProblem), result
    assert isinstance(json.loads(result.stored_arguments), dict)
    return result


def test_valid_arguments_pass():
    raw = '{"path": "a.md", "content": "hi", "mode": "append", "line": null, "tags": ["x"]}'
    result = check_arguments(raw, SCHEMA, cut_off=False)
    assert isinstance(result, ArgumentsOk)
    assert result.args["mode"] == "append" and result.stored_arguments == raw


def test_cut_off_is_reported_before_malformed_json():
    raw = '{"path": "big.md", "content": "lorem ipsum'
    result = problem(raw, cut_off=True)
    assert result.problem == "cut_off"
    assert f"cut off after {len(raw)} characters" in result.message_for_model
    assert "write_file again" in result.message_for_model
    assert json.loads(result.stored_arguments) == {"_invalid_arguments": raw}


def test_cut_off_wins_even_when_the_text_happens_to_parse():
    assert problem('{"path": "a", "content": "b"}', cut_off=True).problem == "cut_off"


@pytest.mark.parametrize("raw", ['{"path": "a",', "{'path': 'a'}", '{"path": "a"} trailing',
                                 '{"path": "a", "content": NaN}', "not json at all"])
def test_malformed_json_is_answered_and_wrapped(raw):
    result = problem(raw)
    assert result.problem == "malformed"
    assert "malformed JSON" in result.message_for_model
    assert "call write_file again" in result.message_for_model.lower()
    assert json.loads(result.stored_arguments) == {"_invalid_arguments": raw}


@pytest.mark.parametrize("raw, kind", [('["a.md", "hi"]', "array"), ('"a.md"', "string"),
                                       ("42", "integer"), ("null", "null")])
def test_non_object_json_is_rejected(raw, kind):
    result = problem(raw)
    assert result.problem == "not_object"
    assert f"got {kind}" in result.message_for_model
    assert json.loads(result.stored_arguments) == {"_invalid_arguments": raw}


def test_malformed_is_reported_before_not_object():
    assert problem("[1, 2").problem == "malformed"


def test_not_object_is_reported_before_schema():
    assert problem("[]").problem == "not_object"


@pytest.mark.parametrize("raw, expected", [
    ('{"content": "x"}', 'missing required parameter "path"'),
    ('{"path": 5, "content": "x"}', 'parameter "path" must be string, got integer 5'),
    ('{"path": "a", "content": "x", "line": "7"}', 'parameter "line" must be integer or null'),
    ('{"path": "a", "content": "x", "line": true}', 'parameter "line" must be integer or null'),
    ('{"path": "a", "content": "x", "ratio": "1.5"}', 'parameter "ratio" must be number'),
    ('{"path": "a", "content": "x", "dry_run": "yes"}', 'parameter "dry_run" must be boolean'),
    ('{"path": "a", "content": "x", "tags": "x"}', 'parameter "tags" must be array'),
    ('{"path": "a", "content": "x", "tags": ["x", 3]}', 'parameter "tags[1]" must be string'),
    ('{"path": "a", "content": "x", "meta": []}', 'parameter "meta" must be object'),
    ('{"path": "a", "content": "x", "mode": "prepend"}',
     'parameter "mode" must be one of "overwrite", "append", got "prepend"'),
    ('{"path": "a", "content": "x", "colour": "red"}', 'unknown parameter "colour"'),
])
def test_schema_mismatches_tell_the_model_what_to_fix(raw, expected):
    result = problem(raw)
    assert result.problem == "schema"
    assert expected in result.message_for_model
    assert result.message_for_model.startswith("INVALID arguments for write_file")
    assert "call write_file again" in result.message_for_model
    assert result.stored_arguments == raw  # already a valid JSON object


def test_several_schema_problems_are_listed_together():
    message = problem('{"path": 1, "extra": 2}').message_for_model
    assert 'missing required parameter "content"' in message
    assert 'parameter "path" must be string' in message
    assert 'unknown parameter "extra"' in message


def test_unknown_keys_are_fine_without_additional_properties_false():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    assert isinstance(check_arguments('{"q": "x", "more": 1}', schema, cut_off=False),
                      ArgumentsOk)


def test_empty_arguments_mean_no_arguments():
    result = check_arguments("", {"type": "object", "properties": {}}, cut_off=False)
    assert result == ArgumentsOk({}, "{}")
    assert problem("  ").message_for_model.count("missing required parameter") == 2


def test_nested_models_are_checked_through_refs():
    class Point(BaseModel):
        x: int
        y: int

    class Plot(BaseModel):
        points: list[Point]

    schema = Plot.model_json_schema()
    assert isinstance(check_arguments('{"points": [{"x": 1, "y": 2}]}', schema, cut_off=False),
                      ArgumentsOk)
    bad = check_arguments('{"points": [{"x": 1}, {"x": "a", "y": 2}]}', schema, cut_off=False)
    assert isinstance(bad, ArgumentsProblem)
    assert 'missing required parameter "points[0].y"' in bad.message_for_model
    assert 'parameter "points[1].x" must be integer' in bad.message_for_model


@settings(max_examples=150, deadline=None)
@given(raw=st.text(max_size=80) | st.builds(json.dumps, st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=8)), cut_off=st.booleans())
def test_stored_arguments_are_always_a_valid_json_object(raw, cut_off):
    result = check_arguments(raw, SCHEMA, cut_off=cut_off)
    stored = json.loads(result.stored_arguments)
    assert isinstance(stored, dict)
    if isinstance(result, ArgumentsProblem) and result.problem != "schema":
        assert stored == {"_invalid_arguments": raw}
