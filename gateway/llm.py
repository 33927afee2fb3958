"""OpenAI-compatible Chat Completions client with SSE streaming (httpx, no vendor SDK)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


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


StreamEvent = TextDelta | ReasoningDelta | ToolCallDelta | Finish | Usage
