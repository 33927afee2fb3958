"""What the gateway has seen of its model server, without asking it again: whether its last
request got an answer, the context window it said, and its last error.

Each server of the client (`llm.base_url`, and those of `llm.models`) keeps a `ServerHealth`
that every request tells how it went (a stream that began: answered; a failed attempt: its
error). A check made at start records into the same object, so what the console's overview and
/readyz show is one account: `model_server_state` is that account for the default model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from gateway.config import LLMConfig
from gateway.events import utcnow
from gateway.llm.discovery import Window
from gateway.llm.errors import LLMError

# Failures that got no answer from the server at all: it is not reachable (an HTTP error status,
# a refusal or a broken stream is an answer: the server is there).
UNREACHED = frozenset({"connection", "timeout"})


@dataclass
class ServerHealth:
    """One server's last answer and last error, as requests went (times in UTC)."""

    answered_at: datetime | None = None  # a request's answer began (or a check was answered)
    failed_at: datetime | None = None
    error: str = ""
    error_kind: str = ""
    clock: Callable[[], datetime] = utcnow

    def answered(self) -> None:
        self.answered_at = self.clock()

    def failed(self, error: LLMError) -> None:
        self.failed_at, self.error, self.error_kind = self.clock(), error.message, error.kind

    @property
    def reachable(self) -> bool | None:
        """Whether the server answered the last time it was asked; None before it was asked."""
        if self.failed_at is not None and (self.answered_at is None or self.failed_at >= self.answered_at):
            return self.error_kind not in UNREACHED
        return True if self.answered_at is not None else None


class Servers(Protocol):
    """What the account is read from (`gateway.llm.client.LLMClient` is one)."""

    config: LLMConfig

    def health_of(self, model: str | None = None) -> ServerHealth: ...

    def known_window(self, model: str | None = None) -> Window | None: ...

    def base_url_of(self, model: str | None = None) -> str: ...


def model_server_state(client: Servers, model: str | None = None) -> dict[str, Any]:
    """The model server of `model` (default: `llm.model`) as the gateway knows it, asking nothing:
    reachable (True, False, or None when not asked yet), its base URL, the model, the context
    window (tokens and where it came from: the setting, the server, or not known yet), the last
    answer and the last error with their times."""
    config = client.config
    ref = config.ref(model)
    health = client.health_of(ref)
    setting = config.window_setting(ref)
    window = None if setting != "auto" else client.known_window(ref)
    return {
        "reachable": health.reachable,
        "base_url": client.base_url_of(ref),
        "model": config.served_model(ref),
        "window": setting if setting != "auto" else (window.tokens if window is not None else None),
        "window_source": "llm.context_window" if setting != "auto" else (window.source if window else ""),
        "answered_at": health.answered_at,
        "error": health.error,
        "error_kind": health.error_kind,
        "error_at": health.failed_at,
    }


__all__ = ["ServerHealth", "UNREACHED", "model_server_state"]
