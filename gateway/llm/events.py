"""Events of a streamed chat completion, and the collected result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal


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
    """What one call used, in OpenAI's terms: `prompt_tokens` is the whole prompt, cache reads
    and writes included; `completion_tokens` the whole reply, reasoning included. `cost_usd` is
    the provider's own price of the call when it sends one (OpenRouter's `usage.cost`)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens read from the provider's cache
    reasoning_tokens: int = 0
    estimated: bool = False  # counted by the gateway: the server sent no usage
    cache_write_tokens: int = 0  # prompt tokens written to the provider's cache
    cost_usd: float | None = None
    kind: Literal["usage"] = "usage"


@dataclass(frozen=True)
class ModelInfo:
    """First event of every stream. `model` is the configured name that answered (`llm.model`
    for the default, else a name of `llm.models`); `served` is the name the server reported in
    its chunks (may differ, or be empty); `attempts` counts HTTP requests made, retries
    included; `fell_back_from` names the models that failed before it (the fallback)."""

    model: str
    served: str = ""
    attempts: int = 1
    fell_back_from: tuple[str, ...] = ()
    kind: Literal["model"] = "model"


@dataclass(frozen=True)
class Replay:
    """What the API needs back on this answer's assistant message in the turn's next rounds
    (Anthropic's signed thinking blocks, Responses' encrypted reasoning items), opaque to the
    loop: JSON `data` of the adapter named `api` (gateway/llm/formats/__init__.py)."""

    api: str
    data: Any
    kind: Literal["replay"] = "replay"


StreamEvent = ModelInfo | TextDelta | ReasoningDelta | ToolCallDelta | Finish | Usage | Replay


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

