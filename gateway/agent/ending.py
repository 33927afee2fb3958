"""How a turn's end is told and recorded: what each way out of the loop means (its own end, a
spend cap, a stop, a lost lease, a failed LLM call, a crash), and what is written then (open
calls closed with a placeholder, the run's stage, the end's message or an apology in the chat)."""

from __future__ import annotations

import logging

from gateway.agent.messages import EndTurn, PlaceholderReason, TurnOutcome, TurnRequest, placeholder_text, shorten
from gateway.agent.services import TurnServices
from gateway.events import ThreadKey
from gateway.llm import LLMError, chat_text
from gateway.llm.gate import BudgetReached
from gateway.running.lifecycle import Interrupted, Stopper
from gateway.store import LeaseLost
from gateway.traces.runs import RunTrace

log = logging.getLogger("gateway.agent.turn")

# A turn to record: the end, the placeholder result of its open tool calls, what the apology names.
Ending = tuple[EndTurn, PlaceholderReason | None, str | None]


def ending_of(exc: Exception, stopper: Stopper, run_id: int, thread: ThreadKey) -> Ending | TurnOutcome:
    """What an exception out of the turn loop means: an end to record, or (when nothing more may
    be written, or the run goes on elsewhere) the outcome itself."""
    if isinstance(exc, EndTurn):
        return exc, None, None
    if isinstance(exc, BudgetReached):
        # "budget: " marks a spend cap (a scheduled run is then recorded skipped (budget))
        return EndTurn("FAILED", "budget", message=f"⚠️ {exc.message}", error=f"budget: {exc.message}"), None, None
    if isinstance(exc, Interrupted):
        if stopper.reason == "shutdown":
            return TurnOutcome(run_id, "SUSPENDED", "shutdown")  # continued after the restart
        if stopper.reason == "lease lost":
            return TurnOutcome(run_id, "LOST", "error", error="lease lost")
        return EndTurn("CANCELED", "canceled"), "canceled", None
    if isinstance(exc, LeaseLost):
        log.warning("%s: %s; stopping without further writes", thread, exc)
        return TurnOutcome(run_id, "LOST", "error", error=str(exc))
    if isinstance(exc, LLMError):
        log.warning("%s: LLM failed: %s", thread, exc)
        return EndTurn("FAILED", "error", error=str(exc)), "interrupted", chat_text(exc)  # the chat: no URL
    log.error("%s: turn crashed", thread, exc_info=exc)
    return EndTurn("FAILED", "error", error=f"{type(exc).__name__}: {exc}"), "interrupted", "an internal error"


async def record_end(
    services: TurnServices,
    request: TurnRequest,
    trace: RunTrace,
    end: EndTurn,
    *,
    thread: ThreadKey,
    placeholder: PlaceholderReason | None,
    apology: str | None,
) -> None:
    """`thread`: where the turn is shown (a child's: its root's chat, where nothing is said)."""
    if placeholder is not None:
        await _close_open_calls(services, request.session.id, placeholder_text(placeholder))
    if end.stage == "FAILED" and end.reason == "error":
        await _mark_trailing_user_rows_failed(services, request)
        await trace.error("turn", end.error)
    stage = "RUNNING" if end.stage == "SUSPENDED" else end.stage  # SUSPENDED: continued after the restart
    await trace.end(stage, end_reason=end.reason, error=end.error or None)
    shown = request.child is None  # a child's end is its parent's tool result
    if end.message and shown:
        await services.outbox.send_text(thread, end.message, key=f"end:{trace.run_id}", reply_to=request.reply_to)
    if apology is not None and request.session.interactive and shown:
        text = f"Sorry, I couldn't finish that: {shorten(apology, 200)}. Please try again."
        await services.outbox.send_text(thread, text, key=f"apology:{trace.run_id}", reply_to=request.reply_to)


async def _close_open_calls(services: TurnServices, session_id: int, text: str) -> None:
    """A stopped or broken turn's open calls: their pending prompts canceled, each call given
    the placeholder result."""
    store = services.store
    for call in await store.sessions.open_tool_calls(session_id):
        prompt = await store.prompts.for_tool_call(call.id)
        if prompt is not None and prompt.status == "pending":
            for canceled in await store.prompts.cancel([prompt.id]):
                await services.prompts.close(canceled)
        await store.sessions.set_tool_call(call.id, status="cancelled", result=text, note=text)


async def _mark_trailing_user_rows_failed(services: TurnServices, request: TurnRequest) -> None:
    history = await services.store.sessions.history(request.session.id, after_seq=request.turn_started_seq - 1)
    trailing = []
    for message in reversed(history):
        if message.role != "user":
            break
        trailing.append(message.id)
    await services.store.sessions.mark_failed(trailing)
