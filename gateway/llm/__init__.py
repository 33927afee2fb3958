"""The model client with SSE streaming (httpx, no vendor SDK), in each model's API: OpenAI Chat
Completions, OpenAI Responses or Anthropic Messages (gateway/llm/formats/).

`LLMClient.stream()` yields one `ModelInfo` first (which configured model answered, after any
retries and fallbacks), then text, reasoning and tool-call deltas, `Finish`, and `Usage` when
the server sends it (the last `Usage` wins). Retries and model fallback happen only before
`ModelInfo` is yielded, so a consumer never sees part of an answer twice. Every failure is an
`LLMError`; closing the generator or cancelling its task closes the HTTP request at once.
"""

from gateway.llm.client import LLMClient, RetryHook, RetryNotice
from gateway.llm.errors import (
    AuthError,
    ContextTooLong,
    EmptyAnswer,
    ErrorKind,
    LLMError,
    LLMUnavailable,
    RateLimited,
    Refused,
    StreamInterrupted,
    chat_text,
    classify_error,
    parse_retry_after,
    without_urls,
)
from gateway.llm.events import (
    Completion,
    Finish,
    ModelInfo,
    ReasoningDelta,
    Replay,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from gateway.llm.stream import ReadCadence, collect

__all__ = [
    "AuthError", "Completion", "ContextTooLong", "EmptyAnswer", "ErrorKind", "Finish", "LLMClient", "LLMError",
    "LLMUnavailable", "ModelInfo", "RateLimited", "ReadCadence", "ReasoningDelta", "Refused", "Replay", "RetryHook",
    "RetryNotice", "StreamEvent", "StreamInterrupted", "TextDelta", "ToolCall", "ToolCallDelta", "Usage",
    "chat_text", "classify_error", "collect", "parse_retry_after", "without_urls",
]
