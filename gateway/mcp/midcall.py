"""What a server on an older protocol asks in the middle of a call (elicitation, sampling),
answered while the call waits inside the server's request.

A question is shown in the chat like the parked ones (buttons for an enum or a yes/no field,
a typed answer otherwise, always Decline; a URL-mode question as its link with Done and
Decline) and answered by who may answer an `ask_user` question, within `questions.timeout`.
The worker keeps the thread meanwhile: the answer (a button press on any instance, or a
message typed in the thread) decides the prompt's row, which this reads. A restart ends the
wait: the prompt expires (gateway/approvals/in_call.py) and the continued turn gives the
call a tool error. Headless sessions decline. This runs in the call's own task context (see
`sdk._InCall`): the sampling it does is spent for the turn's payer.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from typing import Any

from gateway.approvals.in_call import alive_until
from gateway.config import McpServerConfig
from gateway.mcp import elicitation
from gateway.mcp.sampling import PerCall, sample
from gateway.mcp.sdk import Answer, ElicitAnswer, Elicitation, InputRequest, Refusal, SamplingRequest
from gateway.store.items import Said
from gateway.tools.registry import ToolContext, ToolError

log = logging.getLogger(__name__)
POLL_S = 0.25  # how often the waiting call reads its prompt (and the thread's new messages)


class MidCall:
    """The answers of one call's mid-call requests; `refusals` says why any was refused, for
    the tool error when the server then fails the call."""

    def __init__(self, server: str, config: McpServerConfig, tool: str, ctx: ToolContext, sampled: PerCall):
        self.server, self.config, self.tool, self.ctx = server, config, tool, ctx
        self.sampled = sampled  # the call's sampling, counted against its cap
        self.refusals: list[str] = []

    async def answer(self, request: InputRequest) -> Answer:
        try:
            if isinstance(request, Elicitation):
                return await self._ask(request)
            if isinstance(request, SamplingRequest):
                return await sample(self.server, self.config, request, self.ctx, self.sampled)
            raise ToolError(
                f"The MCP server {self.server!r} asked for {request.method!r}, which this gateway does not provide."
            )
        except ToolError as exc:
            self.refusals.append(str(exc))
            return Refusal(str(exc))

    async def _ask(self, request: Elicitation) -> Answer:
        ctx = self.ctx
        prompts, store = ctx.services.get("prompts"), ctx.services.get("store")
        if not ctx.interactive:
            return ElicitAnswer("decline")  # headless: nobody can answer
        if prompts is None or store is None or not ctx.tool_call_id:
            log.info("MCP %s: a mid-call question was declined (no chat to ask in)", self.server)
            return ElicitAnswer("decline")
        # Counted before the question is shown: a reply typed at once must not interrupt the turn.
        waiting, thread_key = prompts.waiting_in_call, str(ctx.thread)
        waiting[thread_key] = waiting.get(thread_key, 0) + 1
        try:
            return await self._shown(request, prompts, store)
        finally:
            waiting[thread_key] -= 1
            if not waiting[thread_key]:
                del waiting[thread_key]

    async def _shown(self, request: Elicitation, prompts: Any, store: Any) -> Answer:
        ctx = self.ctx
        asked = elicitation.question(self.server, request)
        config, now = ctx.services["config"], prompts.clock.now()
        deadline = now + timedelta(seconds=config.questions.timeout)
        liveness = config.inbox.lease_ttl_s
        prompt = await prompts.ask_in_call(
            session_id=ctx.session_id, thread=ctx.thread, tool_call_id=ctx.tool_call_id, run_id=ctx.run_id,
            requested_by=ctx.requested_by, question=asked.text, choices=asked.choices,
            allow_free_text=asked.allow_free_text, link=asked.link,
            restart_error=self._restart_error(request), alive_until=alive_until(now, liveness, deadline),
        )
        await _trace(ctx, self.server, self.tool, prompt.id)
        try:
            decided = await self._wait(prompts, store, prompt, deadline, liveness)
        except asyncio.CancelledError:  # the call was stopped (or the gateway is stopping)
            await asyncio.shield(prompts.end_in_call(prompt, "canceled"))
            raise
        if decided.status == "pending" or decided.status == "expired":
            decided = await prompts.end_in_call(decided)
        else:
            await prompts.close(decided)
        return elicitation.answer(request, decided.status, decided.answer)

    async def _wait(self, prompts: Any, store: Any, prompt: Any, deadline: datetime, liveness: float) -> Any:
        """Until the prompt is decided or its time is up; typed answers in the thread decide it."""
        renew_at = prompts.clock.now().timestamp() + liveness / 3
        while True:
            current = await store.prompts.get(prompt.id)
            if current is None or current.status != "pending":
                return current or prompt
            if current.payload.get("allow_free_text") and await self._typed(prompts, store, current):
                continue
            now = prompts.clock.now()
            if now >= deadline:
                return current
            if now.timestamp() >= renew_at:
                await store.prompts.extend(prompt.id, alive_until(now, liveness, deadline))
                renew_at = now.timestamp() + liveness / 3
            await asyncio.sleep(POLL_S)

    async def _typed(self, prompts: Any, store: Any, prompt: Any) -> bool:
        """A message in the thread from someone who may answer answers the question (the
        worker that would read it is this call's, busy waiting here)."""
        for item in await store.inbox.pending(str(self.ctx.thread), limit=20):
            if item.kind != "message":
                continue
            said = Said.of(item)
            if not prompts.may_decide(prompt, said.sender.id):
                continue
            sender = said.sender
            if await prompts.answer_with_text(prompt, said.text, sender_id=sender.id, sender_name=sender.name):
                await store.inbox.finish([item.id], fence=self.ctx.fence)
            return True
        return False

    def _restart_error(self, request: Elicitation) -> str:
        return (
            f"The MCP tool {self.tool} of {self.server!r} was waiting for the user's answer to its question "
            f"({request.message!r}) when the gateway restarted; that call has ended without an answer and "
            "may or may not have taken effect. Call it again if it is still needed."
        )


async def _trace(ctx: ToolContext, server: str, tool: str, prompt_id: int) -> None:
    store = ctx.services.get("store")
    if store is None or not ctx.run_id:
        return
    try:
        payload = {"server": server, "tool": tool, "call_id": ctx.call_id, "prompt_id": prompt_id, "mid_call": True}
        await store.runs.add_events(ctx.run_id, [("MCP_QUESTION", payload, None)])
    except Exception:  # noqa: BLE001 - a trace write never fails the call
        log.exception("run %s: could not record MCP_QUESTION", ctx.run_id)
