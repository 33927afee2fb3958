"""The OpenAI Responses adapter: the request it builds from the turn's messages, and the
events it decodes from the Responses stream (as OpenAI, vLLM and Ollama send it)."""

from __future__ import annotations

import pytest

from gateway.llm import Finish, RateLimited, ReasoningDelta, TextDelta, ToolCallDelta, Usage
from gateway.llm.errors import ContextTooLong, LLMError
from gateway.llm.events import Replay
from gateway.llm.formats import REPLAY_KEY, Request, format_for
from gateway.llm.formats.responses import ResponsesFormat, ResponsesParser

TOOL = {
    "type": "function",
    "function": {
        "name": "clock",
        "description": "The time.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
    },
}
REASONING_ITEM = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "Ask the clock."}],
    "encrypted_content": "enc_abc",
}
TURN = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "What time is it?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}],
        REPLAY_KEY: {"api": "responses", "data": [REASONING_ITEM]},
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "12:00"},
    {"role": "user", "content": "[context] now"},
]


def body(messages=TURN, **options):
    return ResponsesFormat.body(Request(messages, options.pop("tools", [TOOL]), **options))


# ---- the request ----------------------------------------------------------------------------


def test_the_adapter_is_registered_under_its_api():
    wire = format_for("responses")
    assert (wire.name, wire.path, wire.limit_key) == ("responses", "/responses", "max_output_tokens")
    assert wire.headers("sk-1")["Authorization"] == "Bearer sk-1"
    assert "Authorization" not in wire.headers("")


def test_system_becomes_instructions_and_tools_are_flat_and_come_before_the_input():
    sent = body()
    assert sent["instructions"] == "You are helpful."
    assert sent["tools"] == [
        {
            "type": "function",
            "name": "clock",
            "description": "The time.",
            "parameters": TOOL["function"]["parameters"],
            "strict": False,  # the API's default (strict) refuses schemas that leave properties optional
        }
    ]
    keys = list(sent)
    assert keys.index("instructions") < keys.index("tools") < keys.index("input")
    assert sent["stream"] is True and sent["store"] is False


def test_a_tool_round_becomes_its_reasoning_then_the_call_then_the_output():
    items = body()["input"]
    assert items == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What time is it?"}]},
        REASONING_ITEM,
        {"type": "function_call", "call_id": "call_1", "name": "clock", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "12:00"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "[context] now"}]},
    ]
    assert REPLAY_KEY not in str(items)


def test_another_apis_replay_is_left_out():
    thinking = {"api": "anthropic", "data": [{"type": "thinking", "thinking": "hm", "signature": "sig"}]}
    messages = [TURN[1], {**TURN[2], REPLAY_KEY: thinking}, TURN[3]]
    items = body(messages)["input"]
    assert [item["type"] for item in items] == ["message", "function_call", "function_call_output"]


def test_assistant_text_and_images():
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "look"}, image]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "thanks"},
    ]
    items = body(messages, tools=None)["input"]
    assert items[0]["content"] == [
        {"type": "input_text", "text": "look"},
        {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "auto"},
    ]
    assert items[1] == {"type": "message", "role": "assistant", "content": "A cat."}
    assert "tools" not in body(messages, tools=None)


def test_options_map_to_the_responses_names():
    sent = body(max_tokens=300, temperature=0.2, reasoning="high", cache_key="session-7")
    assert sent["max_output_tokens"] == 300
    assert sent["temperature"] == 0.2
    assert sent["reasoning"] == {"effort": "high"}
    assert sent["include"] == ["reasoning.encrypted_content"]
    assert sent["prompt_cache_key"] == "session-7"
    assert body(reasoning="off")["reasoning"] == {"effort": "minimal"}
    assert body(max_tokens=3)["max_output_tokens"] == 16  # the least OpenAI accepts


def test_reasoning_auto_sends_neither_effort_nor_the_encrypted_include():
    # OpenAI refuses `include: reasoning.encrypted_content` for a model that does not reason.
    sent = body()
    assert "reasoning" not in sent and "include" not in sent
    assert "prompt_cache_key" not in sent and "max_output_tokens" not in sent


# ---- the stream -----------------------------------------------------------------------------


def feed(*payloads):
    parser = ResponsesParser()
    events = [event for payload in payloads for event in parser.feed(payload)]
    return parser, events


def created(model="gpt-5-mini"):
    return {"type": "response.created", "response": {"id": "resp_1", "model": model, "status": "in_progress"}}


def completed(output=(), usage=None, kind="response.completed", **extra):
    response = {"status": kind.split(".")[1], "output": list(output), "usage": usage, **extra}
    return {"type": kind, "response": response}


USAGE = {
    "input_tokens": 2000,
    "input_tokens_details": {"cached_tokens": 1536, "cache_write_tokens": 256},
    "output_tokens": 300,
    "output_tokens_details": {"reasoning_tokens": 200},
    "total_tokens": 2300,
}


def test_text_deltas_finish_and_usage_with_cached_and_reasoning_tokens():
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    done = {**message, "content": [{"type": "output_text", "text": "Hello!"}]}
    parser, events = feed(
        created(),
        {"type": "response.in_progress", "response": {}},
        {"type": "response.output_item.added", "output_index": 0, "item": message},
        {"type": "response.content_part.added", "output_index": 0, "content_index": 0, "part": {}},
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "delta": "Hel"},
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "delta": "lo!"},
        {"type": "response.output_text.done", "item_id": "msg_1", "output_index": 0, "text": "Hello!"},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        completed([done], USAGE),
    )
    assert events == [
        TextDelta("Hel"),
        TextDelta("lo!"),
        Finish("stop"),
        Usage(
            prompt_tokens=2000, completion_tokens=300, cached_tokens=1536, reasoning_tokens=200, cache_write_tokens=256
        ),
    ]
    assert parser.finished and parser.served == "gpt-5-mini"


def test_function_call_deltas_and_done():
    item = {"id": "fc_1", "type": "function_call", "call_id": "call_9", "name": "clock", "arguments": ""}
    done = {**item, "arguments": '{"tz":"UTC"}'}
    _, events = feed(
        created(),
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": '{"tz":'},
        {"type": "response.function_call_arguments.delta", "output_index": 0, "delta": '"UTC"}'},
        {"type": "response.function_call_arguments.done", "output_index": 0, "arguments": '{"tz":"UTC"}'},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        completed([done]),
    )
    assert events == [
        ToolCallDelta(0, id="call_9", name="clock"),
        ToolCallDelta(0, arguments='{"tz":'),
        ToolCallDelta(0, arguments='"UTC"}'),
        Finish("tool_calls"),
    ]


def test_a_server_that_sends_whole_items_only_loses_nothing():
    # Some servers skip the deltas: the done events (or only the final response) carry it all.
    message = {"id": "m", "type": "message", "content": [{"type": "output_text", "text": "Hi."}]}
    call = {"type": "function_call", "call_id": "c1", "name": "clock", "arguments": "{}"}
    _, events = feed(created(), completed([message, call]))
    assert events == [TextDelta("Hi."), ToolCallDelta(0, id="c1", name="clock", arguments="{}"), Finish("tool_calls")]
    _, events = feed(
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        completed([message]),
    )
    assert events == [TextDelta("Hi."), Finish("stop")]


def test_two_calls_get_their_own_indexes():
    first = {"type": "function_call", "call_id": "a", "name": "x", "arguments": ""}
    second = {"type": "function_call", "call_id": "b", "name": "y", "arguments": ""}
    _, events = feed(
        {"type": "response.output_item.added", "output_index": 1, "item": first},
        {"type": "response.output_item.added", "output_index": 2, "item": second},
        {"type": "response.function_call_arguments.delta", "output_index": 2, "delta": "{}"},
        {"type": "response.function_call_arguments.delta", "output_index": 1, "delta": "{}"},
    )
    assert events == [
        ToolCallDelta(0, id="a", name="x"),
        ToolCallDelta(1, id="b", name="y"),
        ToolCallDelta(1, arguments="{}"),
        ToolCallDelta(0, arguments="{}"),
    ]


def test_reasoning_summary_is_reasoning_and_its_item_is_replayed_once():
    item = {"id": "rs_1", "type": "reasoning", "summary": []}
    _, events = feed(
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.reasoning_summary_text.delta", "output_index": 0, "summary_index": 0, "delta": "Ask "},
        {"type": "response.reasoning_summary_text.delta", "output_index": 0, "summary_index": 0, "delta": "it."},
        {"type": "response.reasoning_summary_part.done", "output_index": 0, "summary_index": 0},
        {"type": "response.output_item.done", "output_index": 0, "item": REASONING_ITEM},
        completed([REASONING_ITEM], USAGE),
    )
    assert events[:3] == [ReasoningDelta("Ask "), ReasoningDelta("it."), ReasoningDelta("\n\n")]
    assert events[3] == Replay("responses", [REASONING_ITEM])
    assert [type(e) for e in events[4:]] == [Finish, Usage]


def test_raw_reasoning_text_of_open_models_is_reasoning_and_unencrypted_items_are_not_replayed():
    item = {"id": "rs_2", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "x"}]}
    _, events = feed(
        {"type": "response.reasoning_text.delta", "output_index": 0, "delta": "x"},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        completed([item]),
    )
    assert events == [ReasoningDelta("x"), Finish("stop")]  # no encrypted content: nothing to send back


@pytest.mark.parametrize(("reason", "finish"), [("max_output_tokens", "length"), ("content_filter", "content_filter")])
def test_an_incomplete_response_finishes_by_its_reason(reason, finish):
    parser, events = feed(completed(usage=USAGE, kind="response.incomplete", incomplete_details={"reason": reason}))
    assert events[0] == Finish(finish)
    assert isinstance(events[1], Usage)
    assert parser.finished


def test_a_failed_response_is_classified_by_its_code():
    def failed(code, message="boom"):
        return {
            "type": "response.failed",
            "response": {"status": "failed", "error": {"code": code, "message": message}},
        }

    with pytest.raises(RateLimited):
        feed(failed("rate_limit_exceeded"))
    with pytest.raises(LLMError) as server:
        feed(failed("server_error"))
    assert server.value.kind == "server" and server.value.retryable
    with pytest.raises(ContextTooLong):
        feed(failed("context_length_exceeded", "Your input exceeds the context window of this model."))


def test_error_events_are_classified_by_their_code():
    error = {"type": "error", "code": "rate_limit_exceeded", "message": "slow down", "param": None}
    assert isinstance(ResponsesFormat.classify(None, error), RateLimited)
    nested = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
            "message": "Your input exceeds the context window of this model.",
        },
    }
    assert isinstance(ResponsesFormat.classify(None, nested), ContextTooLong)
    invalid = ResponsesFormat.classify(None, {"type": "error", "code": "invalid_prompt", "message": "no"})
    assert invalid.kind == "bad_request" and not invalid.retryable
    http = ResponsesFormat.classify(
        429, {"error": {"message": "slow", "type": "rate_limit_error"}}, {"retry-after": "3"}
    )
    assert isinstance(http, RateLimited) and http.retry_after == 3


def test_unknown_events_are_ignored():
    _, events = feed({"type": "response.web_search_call.searching"}, {"type": "keepalive"}, {"no": "type"})
    assert events == []


def test_llama_servers_events_keyed_by_item_id_only():
    # llama.cpp's llama-server (tools/server/server-task.cpp) sends no output_index: its events
    # name their item by item_id, and its reasoning item has an empty encrypted_content.
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [], "content": [], "encrypted_content": ""}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    call = {"id": "fc_7", "type": "function_call", "call_id": "call_7", "name": "get_time", "arguments": ""}
    done_reasoning = {**reasoning, "content": [{"type": "reasoning_text", "text": "Checking."}]}
    done_message = {**message, "content": [{"type": "output_text", "text": "Sure."}]}
    done_call = {**call, "arguments": '{"timezone":"Europe/Oslo"}'}
    _, events = feed(
        {"type": "response.created", "response": {"id": "resp_1", "object": "response", "status": "in_progress"}},
        {"type": "response.output_item.added", "item": reasoning},
        {"type": "response.reasoning_text.delta", "delta": "Checking.", "item_id": "rs_1"},
        {"type": "response.output_item.added", "item": message},
        {"type": "response.content_part.added", "item_id": "msg_1", "part": {"type": "output_text", "text": ""}},
        {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "Sure."},
        {"type": "response.output_item.added", "item": call},
        {"type": "response.function_call_arguments.delta", "delta": '{"timezone":', "item_id": "fc_7"},
        {"type": "response.function_call_arguments.delta", "delta": '"Europe/Oslo"}', "item_id": "fc_7"},
        {"type": "response.output_item.done", "item": done_reasoning},
        {"type": "response.output_text.done", "item_id": "msg_1", "text": "Sure."},
        {"type": "response.output_item.done", "item": done_message},
        {"type": "response.output_item.done", "item": done_call},
        completed([done_reasoning, done_message, done_call], {"input_tokens": 40, "output_tokens": 9}),
    )
    assert events == [
        ReasoningDelta("Checking."),
        TextDelta("Sure."),
        ToolCallDelta(0, id="call_7", name="get_time"),
        ToolCallDelta(0, arguments='{"timezone":'),
        ToolCallDelta(0, arguments='"Europe/Oslo"}'),
        Finish("tool_calls"),  # no Replay: an empty encrypted_content cannot be sent back
        Usage(prompt_tokens=40, completion_tokens=9),
    ]


def test_two_items_at_one_position_stay_apart_when_their_ids_differ():
    # LiteLLM's translation from Chat Completions reserves output_index 0 for the message, and
    # may number a reasoning item the same: the ids tell them apart.
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    message = {"id": "msg_1", "type": "message", "content": []}
    done = {**message, "content": [{"type": "output_text", "text": "Hi."}]}
    _, events = feed(
        {"type": "response.output_item.added", "output_index": 0, "item": reasoning},
        {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "delta": "Hm."},
        {"type": "response.output_item.done", "output_index": 0, "item": {**reasoning, "summary": []}},
        {"type": "response.output_item.added", "output_index": 0, "item": message},
        {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0, "delta": "Hi"},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
    )
    assert events == [ReasoningDelta("Hm."), TextDelta("Hi"), TextDelta(".")]


def test_deltas_by_position_then_the_item_by_id_are_one_item():
    done = {"id": "msg_9", "type": "message", "content": [{"type": "output_text", "text": "Hello"}]}
    _, events = feed(
        {"type": "response.output_text.delta", "output_index": 0, "delta": "Hel"},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        completed([done]),
    )
    assert events == [TextDelta("Hel"), TextDelta("lo"), Finish("stop")]


def test_reasoning_with_nothing_after_it_is_not_sent():
    # OpenAI refuses a reasoning item without the item it preceded (an answer cut in its reasoning).
    cut = {"role": "assistant", "content": "", REPLAY_KEY: {"api": "responses", "data": [REASONING_ITEM]}}
    assert body([TURN[1], cut, {"role": "user", "content": "go on"}], tools=None)["input"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "What time is it?"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]},
    ]
