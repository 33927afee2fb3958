"""The tool calls of a round, in declared order: gate each one (rules, bypasses, auto-deny),
park the turn on an approval or a question, run the allowed ones, and settle every call with
exactly one result. A mixin of `Turn` (see turn.py), which owns the loop around it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from gateway import metrics
from gateway.access import role_denial_text
from gateway.agent.child import DELEGATE
from gateway.agent.guards import TOOL_LOOP_NOTICE
from gateway.agent.messages import END_MESSAGES, DeclaredCall, EndTurn, ToolResult, placeholder_text, shorten
from gateway.approvals.policy import AUTO_DENIED, EXPIRED, Bypass, rejection_text
from gateway.events import ThreadKey
from gateway.lifecycle import interruptible
from gateway.store import PromptRecord, ToolCallRecord
from gateway.tools import NeedsAnswer, ToolContext, run_tool

log = logging.getLogger("gateway.agent.turn")

NO_ONE_TO_ASK = "No user can answer questions in this session."
NO_ANSWER = "No answer from the user."
RESTART_NOT_RERUN = "interrupted by a restart; not re-run"
class ToolCallSteps:
    """Tool-call processing of a turn; expects the attributes `Turn` sets up."""

    _notes: dict[str, str] | None

    async def _process_calls(self, calls: list[ToolCallRecord]) -> None:
        results: list[ToolResult] = []
        delegation = self.s.delegation  # a reply of only delegate calls: the children run together
        delegated = await delegation.run_calls(self, calls) if delegation and delegation.is_batch(calls) else None
        for i, call in enumerate(calls):
            status, text = delegated[i] if delegated is not None else await self._process_call(call)
            results.append(ToolResult(call.call_id, call.name, text, "failed" if status == "failed" else "ok"))
        declared = [DeclaredCall(c.call_id, c.name, c.arguments) for c in calls]
        verdict = self.loop_guard.record(declared, results)
        if verdict == "stop":
            raise EndTurn("FAILED", "tool_loop", message=END_MESSAGES["tool_loop"])
        if verdict == "notice":
            await self._notice(TOOL_LOOP_NOTICE)

    async def _process_call(self, call: ToolCallRecord) -> tuple[str, str]:
        if call.name == DELEGATE and self.s.delegation is not None:  # sub-agents: gateway/agent/delegation.py
            return (await self.s.delegation.run_calls(self, [call]))[0]
        spec = self.s.registry.get(call.name)
        if call.status == "running":  # a restart interrupted it mid-run
            if spec is not None and not spec.side_effects:
                return await self._execute(call)
            return await self._settle(call, "failed", RESTART_NOT_RERUN)
        prompt = await self.s.store.prompts.for_tool_call(call.id)
        if prompt is not None:
            return await self._apply_prompt(call, prompt)
        return await self._gate(call)

    async def _apply_prompt(self, call: ToolCallRecord, prompt: PromptRecord) -> tuple[str, str]:
        if prompt.status == "pending":
            await self._park(prompt)
        await self.s.prompts.close(prompt)
        if prompt.kind == "question" and "resume" in prompt.payload:  # a tool's own question: it continues
            resume = {"state": prompt.payload["resume"], "status": prompt.status, "answer": prompt.answer}
            return await self._execute(call, resume=resume)
        if prompt.kind == "question":
            if prompt.status == "answered":
                return await self._settle(call, "done", f"The user answered: {prompt.answer}")
            if prompt.status == "superseded":
                return await self._settle(call, "done", "This question was superseded by a newer question.")
            if prompt.status == "canceled":
                return await self._settle(call, "cancelled", placeholder_text("canceled"))
            return await self._settle(call, "done", NO_ANSWER)
        if prompt.status == "approved":
            return await self._execute(call)
        if prompt.status == "expired":
            return await self._settle(call, "rejected", rejection_text(EXPIRED), note=rejection_text(EXPIRED))
        if prompt.status == "canceled":
            return await self._settle(
                call, "cancelled", placeholder_text("canceled"), note=placeholder_text("canceled")
            )
        text = rejection_text(prompt.answer)
        return await self._settle(call, "rejected", text, note=text)

    async def _gate(self, call: ToolCallRecord) -> tuple[str, str]:
        spec = self.s.registry.get(call.name)
        if spec is None:
            return await self._settle(call, "failed", f"Unknown tool {call.name!r}.")
        args = json.loads(call.arguments or "{}")
        access = self.s.access
        if access is not None and not access.tool_allowed(self.thread.channel, self.req.requested_by, call.name):
            text = role_denial_text(call.name, access.role_name(self.thread.channel, self.req.requested_by))
            return await self._settle(call, "rejected", text, note=text)
        if call.name == "ask_user":
            return await self._ask_user(call, args)
        bypasses = [
            Bypass(b.tool, ThreadKey.parse(b.thread_key), b.expires_at)
            for b in await self.s.store.prompts.active_bypasses(str(self.thread))
        ]
        decision = self.s.policy.decide(
            spec,
            args,
            source=self.session.source,
            interactive=self.session.interactive,
            bypasses=bypasses,
            thread=self.thread,
        )
        if decision.action == "allow":
            return await self._execute(call, args)
        if decision.action == "deny":
            return await self._settle(call, "rejected", decision.reason, note=decision.reason)
        if decision.action == "auto_deny":
            self.auto_denied.append(f"{call.name}({shorten(call.arguments)})")
            metrics.APPROVALS.labels("auto_denied").inc()
            await self.trace.event(
                "AUTO_DENIED", {"tool": call.name, "call_id": call.call_id, "arguments": call.arguments}
            )  # type: ignore[union-attr]
            return await self._settle(call, "rejected", AUTO_DENIED, note=AUTO_DENIED)
        prompt = await self.s.prompts.request_approval(
            self.session,
            self.thread,
            call,
            run_id=self.run_id,
            requested_by=self.req.requested_by,
            reason=decision.reason,
            grant=spec.grant_key,
            agent=self.child.name if self.child is not None else "",
        )
        await self._park(prompt)
        raise AssertionError("unreachable")

    async def _ask_user(self, call: ToolCallRecord, args: dict[str, Any]) -> tuple[str, str]:
        if not self.session.interactive:
            return await self._settle(call, "done", NO_ONE_TO_ASK)
        prompt = await self.s.prompts.ask(
            self.session, self.thread, call, run_id=self.run_id, requested_by=self.req.requested_by,
            question=str(args.get("question", "")), choices=[str(c) for c in args.get("choices") or []],
            allow_free_text=bool(args.get("allow_free_text", True)),
            agent=self.child.name if self.child is not None else "",
        )
        await self._park(prompt)
        raise AssertionError("unreachable")

    async def _park(self, prompt: PromptRecord) -> None:
        await self.trace.event("AWAITING_INPUT", {"prompt_id": prompt.id, "kind": prompt.kind})  # type: ignore[union-attr]
        raise EndTurn("AWAITING_INPUT", "awaiting_input", prompt_id=prompt.id)

    async def _execute(
        self, call: ToolCallRecord, args: dict[str, Any] | None = None, *, resume: dict[str, Any] | None = None
    ) -> tuple[str, str]:
        spec = self.s.registry.get(call.name)
        if spec is None:  # an MCP server went away between the gate and the run
            unavailable = f"The tool {call.name!r} is no longer available (its server is down)."
            return await self._settle(call, "failed", unavailable)
        args = args if args is not None else json.loads(call.arguments or "{}")
        await self.s.store.sessions.set_tool_call(call.id, status="running", fence=self.req.fence)
        await self._show_progress(call)
        ctx = ToolContext(
            session_id=self.session.id,
            thread=self.thread,
            source=self.session.source,
            interactive=self.session.interactive,
            workspace=Path(self.cfg.agent.workspace).resolve(),
            agent=self.cfg.agent,
            notes=self.s.store.sessions,
            services=self.s.tool_services,
            call_id=call.call_id,
            run_id=self.run_id,
            resume=resume,
        )
        started = time.monotonic()
        self._notes = None
        outcome = await interruptible(run_tool(spec, args, ctx), self.stopper)
        if outcome.ask is not None:
            await self._park_on_tool_question(call, outcome.ask)
        status = "failed" if outcome.failed else "done"
        await self.trace.tool_call(  # type: ignore[union-attr]
            name=call.name, call_id=call.call_id, status=status, duration_ms=(time.monotonic() - started) * 1000,
            parent_seq=self.last_response_seq, detail={"arguments": call.arguments, "result": outcome.text},
        )
        return await self._settle(call, status, outcome.text)

    async def _park_on_tool_question(self, call: ToolCallRecord, ask: NeedsAnswer) -> None:
        """The tool asked the user (an MCP elicitation): the call waits, pending, on a question
        prompt like ask_user's, and runs again with the answer."""
        await self.s.store.sessions.set_tool_call(call.id, status="pending", fence=self.req.fence)
        prompt = await self.s.prompts.ask(
            self.session, self.thread, call, run_id=self.run_id, requested_by=self.req.requested_by,
            question=ask.question, choices=ask.choices, allow_free_text=ask.allow_free_text, resume=ask.state,
        )
        await self._park(prompt)

    async def _show_progress(self, call: ToolCallRecord) -> None:
        """A "🔧 tool args" line, for channels that ask for it (the console; Telegram's
        `show_tool_progress`)."""
        channel = self.s.outbox.channels.get(self.thread.channel)
        if not self.session.interactive or not getattr(channel, "show_tool_progress", False):
            return
        try:
            await self.s.outbox.send_text(
                self.thread, f"🔧 {call.name} {shorten(call.arguments, 80)}", key=f"progress:{call.id}"
            )
        except Exception as exc:  # noqa: BLE001 - progress is cosmetic
            log.info("%s: tool progress not shown: %s", self.thread, exc)

    async def _settle(
        self, call: ToolCallRecord, status: str, text: str, *, note: str | None = None
    ) -> tuple[str, str]:
        await self.s.store.sessions.set_tool_call(call.id, status=status, result=text, note=note, fence=self.req.fence)
        metrics.TOOL_CALLS.labels(call.name, status).inc()
        return status, text
