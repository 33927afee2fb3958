"""Typed LLM errors and the classifier for the error dialects of OpenAI, llama.cpp and vLLM."""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping
from typing import Any, Literal

ErrorKind = Literal[
    "auth", "rate_limited", "server", "connection", "timeout", "context_too_long",
    "bad_request", "stream", "unavailable", "empty_answer",
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


class EmptyAnswer(StreamInterrupted):
    """A 200 whose stream ended without a chunk. llama.cpp answers so when its chat template
    raises or the prompt is over its context: retried once, then `Refused`."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="empty_answer")


class Refused(LLMError):
    """The server will refuse this request again (an empty answer to the same body twice):
    not retried. The turn tries a smaller context once when the request was near the window."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="empty_answer", status=200, retryable=False)


class LLMUnavailable(LLMError):
    """Retryable failures on every model until retries or the retry budget ran out."""

    def __init__(self, message: str, *, tried: tuple[str, ...], last_error: LLMError) -> None:
        super().__init__(message, kind="unavailable", status=last_error.status, retryable=True)
        self.tried = tried
        self.last_error = last_error

# What a person in a chat is told of a failed call, by its kind: what happened, never the
# server's address or its raw message (the log and `gateway runs show` keep those).
CHAT_TEXTS: dict[str, str] = {
    "connection": "the model server cannot be reached right now",
    "timeout": "the model server did not answer in time",
    "auth": "the model server refused the gateway's key (the operator can check it with `gateway doctor`)",
    "rate_limited": "the model server is busy (rate limited)",
    "server": "the model server failed to answer",
    "context_too_long": "the conversation is too long for the model",
    "bad_request": "the model server refused the request",
    "stream": "the model's answer broke off",
    "empty_answer": "the model server gave no answer",
}
_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s)\]}>,;'\"]+", re.I)


def chat_text(error: LLMError) -> str:
    """A failed call as the chat may read it (an unavailable server by its last failure)."""
    if isinstance(error, LLMUnavailable):
        return chat_text(error.last_error)
    return CHAT_TEXTS.get(error.kind, "the model server failed")


def without_urls(text: str) -> str:
    """`text` with every URL in it replaced (a server's message may quote its own address)."""
    return _URL.sub("the model server", text)


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
_VALIDATION_DUMP = re.compile(r"\bvalidation errors?\b", re.I)


def error_object(body: Any) -> dict[str, Any]:
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


def as_int(value: Any) -> int | None:
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
    prompt = as_int(err.get("n_prompt_tokens"))
    window = as_int(err.get("n_ctx"))
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
        for source in (body, error_object(body)):
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
    err = error_object(body)
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
    if status is not None and status >= 500 and _VALIDATION_DUMP.search(message):
        # A pydantic dump: the server's request model refused the body, and will again.
        hint = "; try llm.tool_call_content" if "content" in message else ""
        return LLMError(
            f"the LLM server refused the request as invalid ({where}: {message}){hint}", status=status
        )
    if status is None or status >= 500 or status == 408:
        return LLMError(f"LLM server error ({where}: {message})", kind="server", status=status, retryable=True)
    hint = "; check llm.model and llm.base_url" if status == 404 else ""
    return LLMError(f"the LLM server rejected the request ({where}: {message}){hint}", status=status)
