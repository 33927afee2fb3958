"""A check the client makes before every request it sends (each retry and fallback too), and
the report of what the request used. The spend caps (gateway/budgets) implement it; the client
knows nothing of who pays."""

from __future__ import annotations

from typing import Protocol

from gateway.llm.events import Usage


class BudgetReached(Exception):
    """No room under a spend cap for this call: it is not made. `message` is for the chat."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Ticket(Protocol):
    """A reserved call. `reply_tokens` is the reply limit the reservation assumed (sent as
    `max_tokens` when the request has none)."""

    reply_tokens: int | None

    async def settle(self, usage: Usage | None, *, sent: bool) -> None:
        """`sent`: the request reached the model (an answer started); `usage` when reported."""


class CallGate(Protocol):
    async def open(self, model: str, request_bytes: int, max_tokens: int | None) -> Ticket | None:
        """Reserve room for the call or raise `BudgetReached`; None when nothing is capped."""
