"""SSE decoding into JSON payloads (each API's adapter in gateway/llm/formats/ parses them into
stream events); collecting a stream; the cadence streams are read at."""

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
from gateway.llm.formats.chat import ChunkParser

__all__ = ["ChunkParser", "ReadCadence", "SSEDecoder", "SSELineSplitter", "collect"]

# An error payload read mid-stream (status: its code when it gives one) as a typed error.
Classifier = Callable[[int | None, Any], LLMError]


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

    def __init__(self, chunks: AsyncIterator[bytes], classify: Classifier = classify_error) -> None:
        self._chunks = chunks
        self._classify = classify
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
            raise self._classify(code if code and code >= 400 else None, payload)
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
