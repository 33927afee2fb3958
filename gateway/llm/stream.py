"""SSE decoding and chat.completion.chunk parsing into stream events; the cadence streams are read at."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.llm.errors import LLMError, as_int, classify_error, error_object
from gateway.llm.events import (
    Completion,
    Finish,
    ModelInfo,
    ReasoningDelta,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)


class SSELineSplitter:
    """Splits a byte stream into lines at the SSE line ends only: LF, CRLF and CR.

    Lines are cut as bytes, so a UTF-8 character split across network chunks stays whole (no
    multi-byte UTF-8 sequence contains CR or LF), and Unicode separators such as U+2028, which
    may appear raw inside JSON strings, never end a line.
    """

    def __init__(self) -> None:
        self._partial: list[bytes] = []  # the start of a line that has not ended yet
        self._after_cr = False  # the last chunk ended in CR: a leading LF belongs to that line end

    def feed(self, chunk: bytes) -> list[bytes]:
        """The lines that end in `chunk`, without their line ends."""
        if self._after_cr:
            self._after_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if b"\n" not in chunk and b"\r" not in chunk:
            if chunk:
                self._partial.append(chunk)
            return []
        if self._partial:
            self._partial.append(chunk)
            chunk = b"".join(self._partial)
            self._partial = []
        lines = chunk.splitlines()  # bytes.splitlines knows only LF, CRLF and CR
        end = chunk[-1:]
        if end == b"\r":
            self._after_cr = True
        elif end != b"\n":
            self._partial.append(lines.pop())
        return lines

    def flush(self) -> list[bytes]:
        """The last line when the stream ended without a line end."""
        if not self._partial:
            return []
        line = b"".join(self._partial)
        self._partial = []
        return [line]


WAITED_S = 0.0005  # a read this slow went to the event loop; a buffered chunk takes microseconds


class SSEDecoder:
    """Decodes the `data:` events of a text/event-stream body (an async iterator of byte
    chunks, as they arrive); stops at `[DONE]`. `before_read`, when set, is awaited before
    a read that follows one which had to wait for the network (the client's read cadence)."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks
        self.before_read: Callable[[], Awaitable[None]] | None = None
        self._waited = False  # the last read waited for the network (it found nothing buffered)
        self._splitter = SSELineSplitter()
        self._lines: list[bytes] = []  # split but not yet read
        self._read = 0  # how many of `_lines` have been read
        self._ended = False
        self.done = False

    async def next(self) -> dict[str, Any] | None:
        """The next JSON payload, or None at the end of the stream."""
        data: list[bytes] = []
        event = b""
        while not self.done:
            if self._read == len(self._lines) and not await self._fill():
                break
            line = self._lines[self._read]
            self._read += 1
            if not line:
                if data:
                    return self._decode(data, event)
                event = b""
                continue
            if line[:1] == b":":  # comment, e.g. llama.cpp's `: ping`
                continue
            name, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                data.append(value)
            elif name == b"event":
                event = value
        return self._decode(data, event) if data else None

    async def drain(self) -> None:
        """Read what follows [DONE] (usually only the end of the chunked body), so the HTTP
        connection goes back to the pool instead of being closed: one TLS handshake saved per round."""
        self._lines, self._read = [], 0
        if not self._ended:
            async for _ in self._chunks:
                pass
            self._ended = True

    async def _fill(self) -> bool:
        """Split the next chunks until there are lines to read; False at the end of the body."""
        while not self._ended:
            chunk = await self._next_chunk()
            if chunk is None:
                self._ended = True
                self._lines, self._read = self._splitter.flush(), 0
            else:
                self._lines, self._read = self._splitter.feed(chunk), 0
            if self._lines:
                return True
        return False

    async def _next_chunk(self) -> bytes | None:
        """The next chunk of the body. The HTTP stack hands out what one network read brought
        chunk by chunk without waiting; only after a read that had to wait for the network
        is `before_read` awaited, so the pause lets the next chunks gather in the socket
        buffer, and the read after it (which finds them there) is not counted as waiting."""
        if self.before_read is None:
            return await anext(self._chunks, None)
        paused = self._waited
        if paused:
            await self.before_read()
        started = time.perf_counter()
        chunk = await anext(self._chunks, None)
        self._waited = not paused and time.perf_counter() - started > WAITED_S
        return chunk

    def _decode(self, lines: list[bytes], event: bytes) -> dict[str, Any] | None:
        data = b"\n".join(lines).decode("utf-8", "replace")
        if data.strip() == "[DONE]":
            self.done = True
            return None
        payload = _loads(data)
        if not isinstance(payload, dict):
            raise LLMError(f"unexpected stream chunk from the LLM server: {data[:200]!r}", kind="stream")
        if payload.get("error") or event == b"error":
            err = error_object(payload)
            code = as_int(err.get("code"))
            raise classify_error(code if code and code >= 400 else None, payload)
        return payload


def _loads(data: str) -> Any:
    """orjson first; the standard parser for what orjson refuses but it accepts (NaN, Infinity,
    lone surrogate escapes), so what parses is the same as with `json.loads` alone."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(data)
    except ValueError:
        raise LLMError(f"malformed stream chunk from the LLM server: {data[:200]!r}", kind="stream") from None


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
            events.append(_usage(usage, chunk))
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


def _usage(usage: dict[str, Any], chunk: dict[str, Any] | None = None) -> Usage:
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


@dataclass(frozen=True)
class ReadCadence:
    """With many streams in flight each is read at a cadence, not on every chunk: what arrives
    meanwhile waits in the socket buffer (the HTTP stack pauses reading between reads) and
    comes in one read, and a read costs about as much as handling its events, so 1,000
    streams at 20 chunks a second stop being 20,000 wake-ups a second. The wait grows with
    the streams beyond `from_streams` and stays under the second between a chat's drafts or
    edits; the events, so the text and tool calls, are the same, only later by at most `max_s`."""

    from_streams: int = 50  # streams in flight before reads are spaced at all
    per_stream_s: float = 0.002  # seconds between reads per stream beyond that
    max_s: float = 0.5

    def interval(self, streams: int) -> float:
        beyond = streams - self.from_streams
        return 0.0 if beyond <= 0 else min(self.max_s, beyond * self.per_stream_s)
