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


class MinutesTicket(Protocol):
    """A reserved transcription."""

    async def settle_minutes(self, seconds: float | None, *, sent: bool) -> None:
        """`sent`: the server answered with a transcript; `seconds`: the audio's length (None: unknown)."""


class CharsTicket(Protocol):
    """A reserved speech request."""

    async def settle_chars(self, chars: int, *, sent: bool) -> None:
        """`sent`: the server answered with audio; `chars`: the characters it spoke."""


class CallGate(Protocol):
    async def open(self, model: str, request_bytes: int, max_tokens: int | None) -> Ticket | None:
        """Reserve room for the call or raise `BudgetReached`; None when nothing is capped."""

    async def open_minutes(self, model: str, seconds: float | None, audio_bytes: int) -> MinutesTicket | None:
        """The same for a transcription, priced by the minute (`seconds`: the length the
        platform gave, else the bound `audio_bytes` allows)."""

    async def open_chars(self, model: str, chars: int) -> CharsTicket | None:
        """The same for speech, priced by the character (known before the call: no worst case)."""
