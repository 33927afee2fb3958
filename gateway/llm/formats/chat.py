"""OpenAI Chat Completions: the request body, its headers, and chat.completion.chunk parsing."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from gateway.llm.errors import LLMError, as_int, classify_error
from gateway.llm.events import Finish, ReasoningDelta, StreamEvent, TextDelta, ToolCallDelta, Usage
from gateway.llm.formats.base import REPLAY_KEY, Request

OPENAI_HOST = "api.openai.com"
# Chat Completions' `reasoning_effort` (OpenAI, vLLM, LM Studio, Ollama's OpenAI layer); "off"
# is sent as the lowest effort the API knows, since "none" is not accepted everywhere.
REASONING_EFFORT = {"off": "minimal", "low": "low", "medium": "medium", "high": "high"}


class ChatFormat:
    """`api: chat` (the default): POST {base_url}/chat/completions, OpenAI's SSE chunks."""

    name: ClassVar[str] = "chat"
    path: ClassVar[str] = "/chat/completions"
    limit_key: ClassVar[str] = "max_tokens"

    @staticmethod
    def headers(api_key: str) -> dict[str, str]:
        """Every request of a server's clients is the same POST, so these are their default
        headers: merging per-request headers was a third of the cost of building a request."""
        headers = {"Accept": "text/event-stream", "Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        return headers

    @staticmethod
    def body(request: Request) -> dict[str, Any]:
        # tools before messages: the bytes that never change come first, for the servers that
        # cache a request's prefix as sent (and for people reading a captured request)
        body: dict[str, Any] = {"tools": request.tools} if request.tools else {}
        body["messages"] = _without_replay(request.messages)
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if request.max_tokens is not None:
            body["max_tokens"] = request.max_tokens
        if request.temperature is not None:
            body["temperature"] = request.temperature
        if request.reasoning != "auto":
            body["reasoning_effort"] = REASONING_EFFORT[request.reasoning]
        if request.cache_key:
            body["prompt_cache_key"] = request.cache_key
        return body

    @staticmethod
    def parser() -> ChunkParser:
        return ChunkParser()

    @staticmethod
    def classify(status: int | None, body: Any, headers: Mapping[str, str] | None = None) -> LLMError:
        return classify_error(status, body, headers)


def _without_replay(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as they are (no copy) unless one carries another API's replay."""
    if not any(REPLAY_KEY in m for m in messages):
        return messages
    return [{k: v for k, v in m.items() if k != REPLAY_KEY} if REPLAY_KEY in m else m for m in messages]


class ChunkParser:
    """Turns chat.completion.chunk payloads into stream events (choice 0 only)."""

    def __init__(self) -> None:
        self.finished = False
        self._sent: dict[int, set[str]] = {}  # index -> {"id", "name"} already emitted
        self._index_by_id: dict[str, int] = {}
        self._last_index = 0

    def feed(self, chunk: dict[str, Any]) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            events.extend(self._delta(choice.get("delta") or {}))
            if reason := choice.get("finish_reason"):
                self.finished = True
                events.append(Finish(str(reason)))
        if isinstance(usage := chunk.get("usage"), dict):
            events.append(usage_of(usage, chunk))
        return events

    def _delta(self, delta: dict[str, Any]) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        # vLLM sends `reasoning`, llama.cpp `reasoning_content`; some send both with one text.
        reasoning = delta.get("reasoning") or delta.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:
            events.append(ReasoningDelta(reasoning))
        if isinstance(content := delta.get("content"), str) and content:
            events.append(TextDelta(content))
        for call in delta.get("tool_calls") or []:
            if isinstance(call, dict) and (event := self._tool_call(call)):
                events.append(event)
        return events

    def _tool_call(self, call: dict[str, Any]) -> ToolCallDelta | None:
        index = self._index_of(call)
        function = call.get("function") or {}
        arguments = function.get("arguments")
        if arguments is not None and not isinstance(arguments, str):
            arguments = json.dumps(arguments)  # a few servers send an object, not a fragment
        sent = self._sent.setdefault(index, set())
        call_id = self._once(sent, "id", call.get("id"))
        name = self._once(sent, "name", function.get("name"))
        if not (call_id or name or arguments):
            return None
        return ToolCallDelta(index=index, id=call_id, name=name, arguments=arguments or "")

    @staticmethod
    def _once(sent: set[str], key: str, value: Any) -> str:
        if not value or key in sent:
            return ""
        sent.add(key)
        return str(value)

    def _index_of(self, call: dict[str, Any]) -> int:
        """By `index`; servers that omit it are keyed by `id`, else the last call continues."""
        call_id = call.get("id")
        if isinstance(call.get("index"), int):
            index = call["index"]
        elif call_id and call_id in self._index_by_id:
            index = self._index_by_id[call_id]
        elif call_id:
            index = max(self._sent, default=-1) + 1
        else:
            index = self._last_index
        if call_id:
            self._index_by_id.setdefault(call_id, index)
        self._last_index = index
        return index


def usage_of(usage: dict[str, Any], chunk: dict[str, Any] | None = None) -> Usage:
    """The usage object of the dialects: OpenAI and vLLM (`prompt_tokens_details.cached_tokens`,
    `completion_tokens_details.reasoning_tokens`), OpenRouter (also `cache_write_tokens` and
    `cost`), llama.cpp (its `timings.cache_n` when it sends no details) and Anthropic's names
    (`input_tokens`, which leaves the cache out, `cache_read_input_tokens`, `cache_creation_input_tokens`)."""
    prompt_details = _mapping(usage.get("prompt_tokens_details"))
    completion_details = _mapping(usage.get("completion_tokens_details") or usage.get("output_tokens_details"))
    cache_read = _count(prompt_details.get("cached_tokens"), usage.get("cache_read_input_tokens"))
    if cache_read is None and isinstance(timings := (chunk or {}).get("timings"), dict):
        cache_read = as_int(timings.get("cache_n"))
    cache_write = _count(prompt_details.get("cache_write_tokens"), usage.get("cache_creation_input_tokens")) or 0
    if (prompt := as_int(usage.get("prompt_tokens"))) is None:
        # Anthropic counts its cache apart from `input_tokens`: the whole prompt is the sum.
        prompt = (as_int(usage.get("input_tokens")) or 0) + (cache_read or 0) + cache_write
    completion = as_int(usage.get("completion_tokens"))
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion if completion is not None else as_int(usage.get("output_tokens")) or 0,
        cached_tokens=cache_read or 0,
        reasoning_tokens=_count(completion_details.get("reasoning_tokens"), completion_details.get("thinking_tokens"))
        or 0,
        cache_write_tokens=cache_write,
        cost_usd=_usd(usage.get("cost")),
    )


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _count(*values: Any) -> int | None:
    """The largest of the counts given (vLLM sends null details; a server may send 0 beside the real one)."""
    counts = [n for n in (as_int(v) for v in values if not isinstance(v, bool)) if n is not None]
    return max(counts) if counts else None


def _usd(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        return None
    return float(value)
