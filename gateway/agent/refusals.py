"""What a turn does when the model server refuses a request or breaks off an answer.

- A context-too-long refusal, or an empty answer to the same body twice (llama.cpp's way of
  refusing a prompt over its context) while the request was near the window: shrink once
  (the builder learns from the refusal) and send again; a second refusal ends the turn. When
  the turn's own new message is what does not fit, it is set aside (excluded from the context,
  kept in the database) so the next message works.
- An empty answer twice far from the window: the server refuses this conversation (a template
  error, usually); the turn ends naming the server's reason where it gave one.
- A stream that fails after text was shown: the shown text is finished with a note that it was
  cut off, never retried into a second copy.
"""

from __future__ import annotations

from typing import Any

from gateway.agent.messages import END_MESSAGES, EndTurn, TurnRequest
from gateway.agent.rounds import RoundBuilder
from gateway.agent.services import TurnServices
from gateway.delivery.outbox import RecordedStream
from gateway.llm import ContextTooLong, LLMError, Refused, without_urls
from gateway.traces.runs import RunTrace

NEAR_WINDOW = 0.5  # estimates err by this much: a refused request this near the target may be too long
TOO_LONG = (
    "⚠️ Your message is too long for the model's context window{window}, so I set it aside. "
    "Please send it shorter or in parts."
)
REFUSED = (
    "⚠️ The model server refused this conversation: {reason}. Nothing was lost; "
    "check the server's log and the model's chat template (docs/model-servers.md)."
)
CUT_OFF = "⚠️ The model's answer was cut off ({reason})."


def near_window(estimated_tokens: int, target: int) -> bool:
    """A refused request that could be over the window: unbudgeted requests never are known to be."""
    return target > 0 and estimated_tokens >= target * NEAR_WINDOW


def too_long_message(window: int | None) -> str:
    return TOO_LONG.format(window=f" ({window:,} tokens)" if window else "")


def refused_message(error: LLMError) -> str:
    return REFUSED.format(reason=_short(without_urls(error.message)))


def cut_off_text(shown: str, error: LLMError) -> str:
    return f"{shown.rstrip()}\n\n{CUT_OFF.format(reason=_short(without_urls(error.message)))}"


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Refusals:
    """A turn's answers to refusals and broken streams, composed by `Turn` once its run is open."""

    def __init__(self, services: TurnServices, request: TurnRequest, trace: RunTrace):
        self.services = services
        self.req = request
        self.trace = trace
        self.model = services.config.llm.ref(request.session.model)  # the window its context is shaped for
        self.overflow_retries = 0

    async def after_llm_error(
        self, error: LLMError, built: Any, builder: RoundBuilder, stream: RecordedStream, *, round_no: int
    ) -> None:
        """Returns when the request should be sent again (smaller); raises to end the turn."""
        if isinstance(error, ContextTooLong):
            return await self._context_refused(built, error, error.prompt_tokens, error.context_window)
        if isinstance(error, Refused):
            if not near_window(built.estimated_tokens, built.target):
                raise EndTurn("FAILED", "refused", message=refused_message(error), error=str(error)) from error
            return await self._context_refused(built, error, None, None)
        if shown := builder.draft().text.strip():
            # Shown text is finished honestly, never retried into a second copy.
            await stream.finish(f"cut:{self.trace.run_id}:{round_no}", cut_off_text(shown, error))
            raise EndTurn("FAILED", "cut_off", error=str(error)) from error
        raise error

    async def _context_refused(
        self, built: Any, error: LLMError, prompt_tokens: int | None, window: int | None
    ) -> None:
        """Shrink once; a second refusal ends the turn, setting aside the turn's own message when
        it is what does not fit (so the next message works)."""
        await self.trace.error("llm", f"context too long: {error}")
        context = self.services.context
        if self.overflow_retries >= 1 or context is None:
            window = window or (context.window_of(self.model) if context is not None else 0)
            message = END_MESSAGES["overflow"]
            if context is not None and await self._set_aside_request(window):
                message = too_long_message(window)
            raise EndTurn("FAILED", "overflow", message=message, error=str(error)) from error
        self.overflow_retries += 1
        context.correct_from_refusal(self.model, built.raw_tokens, prompt_tokens, window)

    async def _set_aside_request(self, window: int) -> bool:
        """When the turn has nothing but its new user rows and they alone are near the window,
        mark them failed: kept in the database, left out of every later context."""
        session_id = self.req.session.id
        history = await self.services.store.sessions.history(session_id, after_seq=self.req.turn_started_seq - 1)
        if not history or any(row.role != "user" for row in history):
            return False
        tokens = self.services.context.estimate(self.model, sum(len(row.content) for row in history))
        if not near_window(tokens, window):
            return False
        await self.services.store.sessions.mark_failed([row.id for row in history])
        if self.services.context is not None:
            self.services.context.forget(session_id)
        return True
