"""The seam's types: the call as the turn asks for it, the adapter's protocol, the replay key
(the contract is in gateway/llm/formats/__init__.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from gateway.config.core import Reasoning
from gateway.llm.errors import LLMError
from gateway.llm.events import StreamEvent

REPLAY_KEY = "_replay"  # on an assistant message: {"api": name, "data": what its parser emitted}


@dataclass(frozen=True)
class Request:
    """One call as the turn asks for it, before any API's shape."""

    messages: list[dict[str, Any]]  # Chat Completions messages; assistant ones may carry REPLAY_KEY
    tools: list[dict[str, Any]] | None = None  # [{"type": "function", "function": {name, description, parameters}}]
    max_tokens: int | None = None  # None: the API's default (an API that needs one picks its own)
    temperature: float | None = None
    reasoning: Reasoning = "auto"  # auto: nothing sent
    cache_key: str | None = None  # the session's key, set only when the model takes one


class StreamParser(Protocol):
    finished: bool

    def feed(self, payload: dict[str, Any]) -> list[StreamEvent]: ...


class WireFormat(Protocol):
    name: ClassVar[str]
    path: ClassVar[str]
    limit_key: ClassVar[str]

    def headers(self, api_key: str) -> dict[str, str]: ...

    def body(self, request: Request) -> dict[str, Any]: ...

    def parser(self) -> StreamParser: ...

    def classify(self, status: int | None, body: Any, headers: Mapping[str, str] | None = None) -> LLMError: ...


def replay_of(message: dict[str, Any], api: str) -> Any:
    """The replay an assistant message carries for `api`, else None."""
    carried = message.get(REPLAY_KEY)
    if isinstance(carried, dict) and carried.get("api") == api:
        return carried.get("data")
    return None
