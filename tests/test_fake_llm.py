"""The scripted fake LLM server itself: stream shape, scripting, strict-provider 400s."""

from __future__ import annotations

import json

import httpx
import pytest
from fakes.llm import FakeLLM, Reply, context_error_body

USER = {"role": "user", "content": "hi"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "clock", "arguments": "{}"}}
ASSISTANT_CALL = {"role": "assistant", "content": "", "tool_calls": [CALL]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}
TOOL = {"type": "function", "function": {"name": "clock", "parameters": {"type": "object"}}}


@pytest.fixture
async def fake():
    async with FakeLLM(chunk_chars=3) as llm:
        yield llm


async def post(fake: FakeLLM, body: dict | bytes, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient() as client:
        url = f"{fake.base_url}/chat/completions"
        if isinstance(body, bytes):
            return await client.post(url, content=body, headers=headers)
        return await client.post(url, json=body, headers=headers)


def chat(*messages: dict, tools: list | None = None, usage: bool = True) -> dict:
    body = {"model": "m", "messages": list(messages), "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    if tools is not None:
        body["tools"] = tools
    return body


def data_frames(text: str) -> list[dict | str]:
    frames = []
    for line in text.splitlines():
        if line.startswith("data: "):
            raw = line[len("data: "):]
            frames.append(raw if raw == "[DONE]" else json.loads(raw))
    return frames


async def test_tool_call_stream_looks_like_a_real_server(fake):
    fake.tool_call("clock", {"timezone": "Europe/Oslo"}, id="call_9")
    response = await post(fake, chat(USER))
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert response.text.startswith(": ping\n\n")

    frames = data_frames(response.text)
    assert frames[-1] == "[DONE]"
    usage_frame = frames[-2]
    assert usage_frame["choices"] == [] and usage_frame["usage"]["prompt_tokens"] > 0
    assert all(f["usage"] is None for f in frames[:-2])
    calls = [c for f in frames[:-2] for c in f["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0] == {"index": 0, "id": "call_9", "type": "function",
                        "function": {"name": "clock", "arguments": ""}}
    fragments = calls[1:]
    assert len(fragments) > 2 and all("id" not in c and "name" not in c["function"] for c in fragments)
    assert json.loads("".join(c["function"]["arguments"] for c in fragments)) == {"timezone": "Europe/Oslo"}
    assert frames[-3]["choices"][0]["finish_reason"] == "tool_calls"


async def test_no_usage_chunk_unless_asked(fake):
    frames = data_frames((await post(fake, chat(USER, usage=False))).text)
    assert all(f == "[DONE]" or (f["choices"] and "usage" not in f) for f in frames)


async def test_reasoning_goes_in_the_chosen_field(fake):
    fake.reasoning("hmm", "ok", field="reasoning")
    frames = data_frames((await post(fake, chat(USER))).text)
    deltas = [f["choices"][0]["delta"] for f in frames if isinstance(f, dict) and f["choices"]]
    assert "".join(d.get("reasoning", "") for d in deltas) == "hmm"
    assert not any("reasoning_content" in d for d in deltas)


async def test_script_plays_in_order_then_responder_answers(fake):
    fake.reply("first")
    fake.error(500)
    fake.responder = lambda body: Reply(f"echo {len(body['messages'])}")

    def text(response: httpx.Response) -> str:
        frames = data_frames(response.text)
        return "".join(
            f["choices"][0]["delta"].get("content") or "" for f in frames if isinstance(f, dict) and f["choices"]
        )

    assert text(await post(fake, chat(USER))) == "first"
    assert (await post(fake, chat(USER))).status_code == 500
    assert fake.pending == 0
    assert text(await post(fake, chat(USER, {"role": "assistant", "content": "x"}, USER))) == "echo 3"
    assert len(fake.requests) == 3 and fake.requests[2]["messages"][1]["content"] == "x"


async def test_default_answer_is_ok():
    async with FakeLLM() as fake:
        frames = data_frames((await post(fake, chat(USER))).text)
    assert (
        "".join(f["choices"][0]["delta"].get("content") or "" for f in frames if isinstance(f, dict) and f["choices"])
        == "ok"
    )


async def test_error_puts_retry_after_where_asked(fake):
    fake.error(429, retry_after=3)
    fake.error(429, retry_after=1.5, retry_after_in="body")
    first, second = await post(fake, chat(USER)), await post(fake, chat(USER))
    assert first.status_code == 429 and first.headers["Retry-After"] == "3"
    assert second.json()["retry_after"] == 1.5 and "Retry-After" not in second.headers


async def test_api_key_is_checked_when_configured():
    async with FakeLLM(api_key="secret") as fake:
        assert (await post(fake, chat(USER))).status_code == 401
        assert (await post(fake, chat(USER), Authorization="Bearer secret")).status_code == 200


async def test_well_formed_tool_exchange_is_accepted(fake):
    body = chat({"role": "system", "content": "s"}, USER, ASSISTANT_CALL, RESULT,
                {"role": "assistant", "content": "It is noon."}, USER, tools=[TOOL])
    assert (await post(fake, body)).status_code == 200
    assert fake.rejections == []


MALFORMED = {
    "tool result without its call": (chat(USER, RESULT), "no preceding assistant tool call"),
    "call without result before user": (chat(USER, ASSISTANT_CALL, USER), "have no tool result before this user"),
    "call without result at the end": (chat(USER, ASSISTANT_CALL), "have no tool result"),
    "second result for one call": (chat(USER, ASSISTANT_CALL, RESULT, RESULT), "no preceding assistant tool call"),
    "duplicate tool names": (chat(USER, tools=[TOOL, TOOL]), "duplicate function name(s): clock"),
    "reasoning_content sent back": (
        chat(USER, {"role": "assistant", "content": "a", "reasoning_content": "r"}, USER),
        "'reasoning_content'",
    ),
    "reasoning sent back": (chat(USER, {"role": "assistant", "content": "a", "reasoning": "r"}, USER), "'reasoning'"),
    "unparseable call arguments": (
        chat(
            USER, {**ASSISTANT_CALL, "tool_calls": [{**CALL, "function": {"name": "clock", "arguments": "{"}}]}, RESULT
        ),
        "not valid JSON",
    ),
    "unknown role": (chat({"role": "robot", "content": "x"}), "unknown role 'robot'"),
    "no messages": (chat(), "messages: must be a non-empty array"),
    "not streaming": ({"model": "m", "messages": [USER]}, "set stream: true"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_malformed_requests_get_400_with_a_reason(fake, case):
    body, expected = MALFORMED[case]
    response = await post(fake, body)
    assert response.status_code == 400
    assert expected in response.json()["error"]["message"]
    assert fake.rejections and expected in fake.rejections[-1]


async def test_invalid_json_body_gets_400(fake):
    response = await post(fake, b"{oops", **{"Content-Type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    assert fake.requests == []


def test_unknown_context_dialect_is_refused():
    with pytest.raises(ValueError, match="openai, llamacpp or vllm"):
        context_error_body("tgi", 10, 5)
