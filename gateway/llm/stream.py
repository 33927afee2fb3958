"""SSE decoding and chat.completion.chunk parsing into stream events."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from gateway.llm.errors import LLMError, as_int, classify_error, error_object
from gateway.llm.events import (
    Completion, Finish, ModelInfo, ReasoningDelta, StreamEvent, TextDelta, ToolCall, ToolCallDelta, Usage,
)


class SSEDecoder:
    """Decodes the `data:` events of a text/event-stream body; stops at `[DONE]`."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self._lines = lines
        self.done = False

    async def next(self) -> dict[str, Any] | None:
        """The next JSON payload, or None at the end of the stream."""
        data: list[str] = []
        event = ""
        if self.done:
            return None
        async for line in self._lines:
            if line == "":
                if data:
                    return self._decode("\n".join(data), event)
                event = ""
                continue
            if line.startswith(":"):  # comment, e.g. llama.cpp's `: ping`
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value
        return self._decode("\n".join(data), event) if data else None

    async def drain(self) -> None:
        """Read what follows [DONE] (usually only the end of the chunked body), so the HTTP
        connection goes back to the pool instead of being closed: one TLS handshake saved per round."""
        async for _ in self._lines:
            pass

    def _decode(self, data: str, event: str) -> dict[str, Any] | None:
        if data.strip() == "[DONE]":
            self.done = True
            return None
        try:
            payload = json.loads(data)
        except ValueError:
            raise LLMError(f"malformed stream chunk from the LLM server: {data[:200]!r}", kind="stream") from None
        if not isinstance(payload, dict):
            raise LLMError(f"unexpected stream chunk from the LLM server: {data[:200]!r}", kind="stream")
        if payload.get("error") or event == "error":
            err = error_object(payload)
            code = as_int(err.get("code"))
            raise classify_error(code if code and code >= 400 else None, payload)
        return payload


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
            events.append(_usage(usage))
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


def _usage(usage: dict[str, Any]) -> Usage:
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    return Usage(
        prompt_tokens=as_int(usage.get("prompt_tokens")) or 0,
        completion_tokens=as_int(usage.get("completion_tokens")) or 0,
        cached_tokens=as_int(prompt_details.get("cached_tokens")) or 0,
        reasoning_tokens=as_int(completion_details.get("reasoning_tokens")) or 0,
    )


async def collect(events: AsyncIterator[StreamEvent]) -> Completion:
    """Gather a whole stream into one `Completion`."""
    text: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    finish: str | None = None
    usage: Usage | None = None
    model = served = ""
    async with aclosing(events):  # type: ignore[type-var]
        async for event in events:
            match event:
                case ModelInfo():
                    model, served = event.model, event.served
                case TextDelta():
                    text.append(event.text)
                case ReasoningDelta():
                    reasoning.append(event.text)
                case ToolCallDelta():
                    call = calls.setdefault(event.index, {"id": "", "name": "", "arguments": ""})
                    call["id"] = call["id"] or event.id
                    call["name"] = call["name"] or event.name
                    call["arguments"] += event.arguments
                case Finish():
                    finish = event.reason
                case Usage():
                    usage = event
    tool_calls = tuple(ToolCall(**calls[index]) for index in sorted(calls))
    return Completion("".join(text), "".join(reasoning), tool_calls, finish, usage, model, served)

