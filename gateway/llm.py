"""OpenAI-compatible Chat Completions client with SSE streaming (httpx, no vendor SDK).

`LLMClient.stream()` yields one `ModelInfo` first (which configured model answered, after any
retries and fallbacks), then text, reasoning and tool-call deltas, `Finish`, and `Usage` when
the server sends it (the last `Usage` wins). Retries and model fallback happen only before
`ModelInfo` is yielded, so a consumer never sees part of an answer twice. Every failure is an
`LLMError`; closing the generator or cancelling its task closes the HTTP request at once.
"""

from __future__ import annotations

import asyncio
import email.utils
import inspect
import json
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from gateway.config import LLMConfig


@dataclass(frozen=True)
class TextDelta:
    text: str
    kind: Literal["text"] = "text"


@dataclass(frozen=True)
class ReasoningDelta:
    text: str
    kind: Literal["reasoning"] = "reasoning"


@dataclass(frozen=True)
class ToolCallDelta:
    """A streamed tool call fragment. `id` and `name` arrive once (first fragment of an index);
    `arguments` fragments are concatenated in order."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""
    kind: Literal["tool_call"] = "tool_call"


@dataclass(frozen=True)
class Finish:
    reason: str  # stop | tool_calls | length | content_filter
    kind: Literal["finish"] = "finish"


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    kind: Literal["usage"] = "usage"


@dataclass(frozen=True)
class ModelInfo:
    """First event of every stream. `model` is the configured name that answered (`llm.model`
    or one of `llm.fallback_models`); `served` is the name the server reported in its chunks
    (may differ, or be empty); `attempts` counts HTTP requests made, retries included."""

    model: str
    served: str = ""
    attempts: int = 1
    kind: Literal["model"] = "model"


StreamEvent = ModelInfo | TextDelta | ReasoningDelta | ToolCallDelta | Finish | Usage


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text as streamed; may be invalid when cut by `length`


@dataclass(frozen=True)
class Completion:
    text: str
    reasoning: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    usage: Usage | None
    model: str
    served: str = ""


@dataclass(frozen=True)
class RetryNotice:
    """Passed to `on_retry` before each new attempt. `next_model` differs from `model` when the
    client falls back; `delay_s` is the wait before the next attempt."""

    attempt: int
    model: str
    next_model: str
    delay_s: float
    error: LLMError
    kind: Literal["retry"] = "retry"


# --- errors -------------------------------------------------------------------------------

ErrorKind = Literal[
    "auth", "rate_limited", "server", "connection", "timeout", "context_too_long",
    "bad_request", "stream", "unavailable",
]


class LLMError(Exception):
    def __init__(
        self, message: str, *, kind: ErrorKind = "bad_request", status: int | None = None,
        retryable: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.status = status
        self.retryable = retryable


class AuthError(LLMError):
    """401/403: never retried."""


class RateLimited(LLMError):
    def __init__(self, message: str, *, status: int | None = 429, retry_after: float | None = None) -> None:
        super().__init__(message, kind="rate_limited", status=status, retryable=True)
        self.retry_after = retry_after


class ContextTooLong(LLMError):
    """The prompt does not fit; the numbers are the server's, None when it did not say."""

    def __init__(
        self, message: str, *, status: int | None = 400, prompt_tokens: int | None = None,
        context_window: int | None = None,
    ) -> None:
        super().__init__(message, kind="context_too_long", status=status, retryable=False)
        self.prompt_tokens = prompt_tokens
        self.context_window = context_window


class StreamInterrupted(LLMError):
    """The connection dropped or the stream ended before the answer was complete."""

    def __init__(self, message: str, *, kind: ErrorKind = "stream") -> None:
        super().__init__(message, kind=kind, retryable=True)


class LLMUnavailable(LLMError):
    """Retryable failures on every model until retries or the retry budget ran out."""

    def __init__(self, message: str, *, tried: tuple[str, ...], last_error: LLMError) -> None:
        super().__init__(message, kind="unavailable", status=last_error.status, retryable=True)
        self.tried = tried
        self.last_error = last_error


_CONTEXT_HINT = re.compile(
    r"maximum context length|context size|context window|context length|too many tokens", re.I
)
_WINDOW_NUMBERS = (
    re.compile(r"maximum context length is (\d+)", re.I),
    re.compile(r"context size \((\d+) tokens?\)", re.I),
    re.compile(r"context window (?:of|is) (\d+)", re.I),
)
_PROMPT_NUMBERS = (
    re.compile(r"\((\d+) in the messages", re.I),  # vLLM: "you requested N tokens (M in the messages, ..."
    re.compile(r"your request has (\d+)", re.I),
    re.compile(r"resulted in (\d+) tokens", re.I),  # OpenAI
    re.compile(r"request \((\d+) tokens?\)", re.I),  # llama.cpp message text
    re.compile(r"you requested (\d+) tokens", re.I),
)
_MAX_MESSAGE = 500


def _error_object(body: Any) -> dict[str, Any]:
    """The `error` object of the known dialects (also vLLM's old flat shape and bare strings)."""
    if isinstance(body, dict):
        inner = body.get("error")
        if isinstance(inner, dict):
            return inner
        if isinstance(inner, str):
            return {"message": inner}
        return body
    return {"message": str(body or "")}


def _first_int(patterns: tuple[re.Pattern[str], ...], text: str) -> int | None:
    for pattern in patterns:
        if match := pattern.search(text):
            return int(match.group(1))
    return None


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _is_context_error(err: Mapping[str, Any], message: str) -> bool:
    return (
        err.get("code") == "context_length_exceeded"
        or err.get("type") == "exceed_context_size_error"
        or bool(_CONTEXT_HINT.search(message))
    )


def _context_error(status: int | None, err: Mapping[str, Any], message: str) -> ContextTooLong:
    prompt = _as_int(err.get("n_prompt_tokens"))
    window = _as_int(err.get("n_ctx"))
    prompt = prompt if prompt is not None else _first_int(_PROMPT_NUMBERS, message)
    window = window if window is not None else _first_int(_WINDOW_NUMBERS, message)
    return ContextTooLong(
        f"the prompt does not fit the model's context: {message}", status=status,
        prompt_tokens=prompt, context_window=window,
    )


def parse_retry_after(headers: Mapping[str, str] | None, body: Any, now: float | None = None) -> float | None:
    """Seconds to wait: `retry-after-ms` / `Retry-After` header (seconds or HTTP date), then the
    body's `retry_after`, then `error.retry_after`."""
    headers = headers or {}
    if (millis := _as_float(headers.get("retry-after-ms"))) is not None:
        return max(0.0, millis / 1000)
    raw = headers.get("retry-after")
    if raw is not None:
        if (seconds := _as_float(raw)) is not None:
            return max(0.0, seconds)
        try:
            when = email.utils.parsedate_to_datetime(raw).timestamp()
            return max(0.0, when - (time.time() if now is None else now))
        except (TypeError, ValueError):
            pass
    if isinstance(body, dict):
        for source in (body, _error_object(body)):
            if (seconds := _as_float(source.get("retry_after"))) is not None:
                return max(0.0, seconds)
    return None


def _as_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def classify_error(status: int | None, body: Any, headers: Mapping[str, str] | None = None) -> LLMError:
    """Map an HTTP error (or a mid-stream `{"error": ...}` with status None or its code) to a
    typed error."""
    err = _error_object(body)
    message = str(err.get("message") or err.get("detail") or "no message")[:_MAX_MESSAGE]
    where = f"HTTP {status}" if status else "stream error"
    if status in (401, 403):
        return AuthError(
            f"the LLM server refused the credentials ({where}: {message}); check llm.api_key",
            kind="auth", status=status,
        )
    if status == 429:
        seconds = parse_retry_after(headers, body)
        return RateLimited(f"rate limited by the LLM server ({where}: {message})", retry_after=seconds)
    if _is_context_error(err, message):
        return _context_error(status, err, message)
    if status is None or status >= 500 or status == 408:
        return LLMError(f"LLM server error ({where}: {message})", kind="server", status=status, retryable=True)
    hint = "; check llm.model and llm.base_url" if status == 404 else ""
    return LLMError(f"the LLM server rejected the request ({where}: {message}){hint}", status=status)


def _transport_error(exc: httpx.TransportError, url: str) -> LLMError:
    if isinstance(exc, httpx.TimeoutException):
        return LLMError(f"the LLM server at {url} timed out ({type(exc).__name__})", kind="timeout", retryable=True)
    detail = str(exc) or type(exc).__name__
    return LLMError(f"cannot reach the LLM server at {url}: {detail}", kind="connection", retryable=True)


# --- SSE decoding and chunk parsing -------------------------------------------------------


class _SSE:
    """Decodes the `data:` events of a text/event-stream body; stops at `[DONE]`."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()
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
            err = _error_object(payload)
            code = _as_int(err.get("code"))
            raise classify_error(code if code and code >= 400 else None, payload)
        return payload


class _ChunkParser:
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
        prompt_tokens=_as_int(usage.get("prompt_tokens")) or 0,
        completion_tokens=_as_int(usage.get("completion_tokens")) or 0,
        cached_tokens=_as_int(prompt_details.get("cached_tokens")) or 0,
        reasoning_tokens=_as_int(completion_details.get("reasoning_tokens")) or 0,
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


# --- the client ---------------------------------------------------------------------------

RetryHook = Callable[[RetryNotice], Awaitable[None] | None]


@dataclass
class _Opened:
    response: httpx.Response
    sse: _SSE
    first: dict[str, Any]
    model: str
    attempts: int


class LLMClient:
    """Streaming Chat Completions against `llm.base_url`, with retries and model fallback.

    `sleep`, `clock` and `rng` are injectable so tests can observe waits without waiting.
    """

    def __init__(
        self,
        config: LLMConfig,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        on_retry: RetryHook | None = None,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        timeout = httpx.Timeout(config.request_timeout_s, connect=config.connect_timeout_s)
        self._http = httpx.AsyncClient(transport=transport, timeout=timeout)
        self._on_retry = on_retry
        self._backoff_base = backoff_base_s
        self._backoff_max = backoff_max_s
        self._sleep = sleep
        self._clock = clock
        self._rng = rng or random.Random()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def stream(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        on_retry: RetryHook | None = None,
    ) -> AsyncIterator[StreamEvent]:
        body = self._body(messages, tools, max_tokens)
        opened = await self._open(body, self._models(model), on_retry or self._on_retry)
        try:
            yield ModelInfo(opened.model, str(opened.first.get("model") or ""), opened.attempts)
            parser = _ChunkParser()
            payload: dict[str, Any] | None = opened.first
            while payload is not None:
                for event in parser.feed(payload):
                    yield event
                payload = await self._next_payload(opened.sse)
            if not (opened.sse.done or parser.finished):
                raise StreamInterrupted("the LLM stream ended before the answer was complete")
        finally:
            await opened.response.aclose()  # also aborts generation when the consumer stops early

    async def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        tools: list[dict[str, Any]] | None = None,
        on_retry: RetryHook | None = None,
    ) -> Completion:
        return await collect(self.stream(messages, tools, model=model, max_tokens=max_tokens, on_retry=on_retry))

    def _models(self, model: str | None) -> list[str]:
        primary = model or self.config.model
        return [primary] + [m for m in self.config.fallback_models if m != primary]

    def _body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, max_tokens: int | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if tools:
            body["tools"] = tools
        if (limit := max_tokens or self.config.max_tokens) is not None:
            body["max_tokens"] = limit
        if self.config.temperature is not None:
            body["temperature"] = self.config.temperature
        return body

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    async def _open(self, body: dict[str, Any], models: list[str], on_retry: RetryHook | None) -> _Opened:
        """Try each model in turn, retrying retryable failures with backoff, until one starts
        streaming; raise `LLMUnavailable` once retries or the budget are spent."""
        started = self._clock()
        attempts = 0
        last: LLMError | None = None
        for position, model in enumerate(models):
            for retry in range(self.config.max_retries + 1):
                attempts += 1
                try:
                    return await self._attempt({"model": model, **body}, model, attempts)
                except LLMError as exc:
                    if not exc.retryable:
                        raise
                    last = exc
                delay = self._delay(last, retry)
                if retry >= self.config.max_retries or self._spent(started) + delay > self.config.retry_budget_s:
                    break
                await self._notify(on_retry, RetryNotice(attempts, model, model, delay, last))
                await self._sleep(delay)
            has_next = position + 1 < len(models)
            if not has_next or self._spent(started) >= self.config.retry_budget_s:
                break
            await self._notify(on_retry, RetryNotice(attempts, model, models[position + 1], 0.0, last))
        assert last is not None
        tried = tuple(models[: position + 1])
        raise LLMUnavailable(
            f"LLM unavailable after {attempts} attempt(s) (models tried: {', '.join(tried)}): {last.message}",
            tried=tried, last_error=last,
        ) from last

    async def _attempt(self, body: dict[str, Any], model: str, attempts: int) -> _Opened:
        request = self._http.build_request("POST", self.url, json=body, headers=self._headers())
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise _transport_error(exc, self.url) from exc
        try:
            if response.status_code != 200:
                raise classify_error(response.status_code, _json_or_text(await response.aread()), response.headers)
            sse = _SSE(response)
            first = await sse.next()
            if first is None:
                raise StreamInterrupted("the LLM server sent an empty stream")
            return _Opened(response, sse, first, model, attempts)
        except httpx.TransportError as exc:
            await response.aclose()
            raise _transport_error(exc, self.url) from exc
        except BaseException:
            await response.aclose()
            raise

    async def _next_payload(self, sse: _SSE) -> dict[str, Any] | None:
        try:
            return await sse.next()
        except httpx.TransportError as exc:
            kind: ErrorKind = "timeout" if isinstance(exc, httpx.TimeoutException) else "connection"
            raise StreamInterrupted(f"the LLM stream broke off: {exc or type(exc).__name__}", kind=kind) from exc

    def _delay(self, error: LLMError, retry: int) -> float:
        """Retry-After plus up to 10% jitter when the server says; else jittered exponential."""
        if isinstance(error, RateLimited) and error.retry_after is not None:
            return error.retry_after * (1 + self._rng.uniform(0, 0.1))
        backoff = min(self._backoff_max, self._backoff_base * 2**retry)
        return backoff * self._rng.uniform(0.5, 1.0)

    def _spent(self, started: float) -> float:
        return self._clock() - started

    @staticmethod
    async def _notify(hook: RetryHook | None, notice: RetryNotice) -> None:
        if hook is not None and inspect.isawaitable(result := hook(notice)):
            await result


def _json_or_text(raw: bytes) -> Any:
    text = raw.decode("utf-8", "replace")
    try:
        return json.loads(text)
    except ValueError:
        return text
