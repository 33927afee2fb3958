"""The tool calls of a round, in declared order: check each one as the round is recorded, gate
it (roles, rules, bypasses, auto-deny), park the turn on an approval or a question, run the
allowed ones, and settle every call with exactly one result.

`ToolCalls` is composed by `Turn` (turn.py) once its run is open, and given what it needs:
the services, the request, the run's trace, the stopper, the loop guard, the notice callback.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

from gateway import telemetry
from gateway.access import role_denial_text
from gateway.agent import spans
from gateway.agent.arguments import ArgumentsProblem, check_arguments
from gateway.agent.audit_trail import Decided, by_policy, by_prompt, by_role, tool_call_entry
from gateway.agent.child import DELEGATE
from gateway.agent.files import files_dir
from gateway.agent.guards import TOOL_LOOP_NOTICE, ToolLoopGuard
from gateway.agent.messages import (
    END_MESSAGES,
    DeclaredCall,
    EndTurn,
    OpenCall,
    ToolResult,
    TurnRequest,
    placeholder_text,
    shorten,
)
from gateway.agent.services import TurnServices
from gateway.agent.voices import Voice, denial_text, described
from gateway.approvals.in_call import restart_error
from gateway.approvals.policy import AUTO_DENIED, EXPIRED, Bypass, PolicyDecision, rejection_text
from gateway.events import ThreadKey
from gateway.running.lifecycle import Stopper, interruptible
from gateway.serving import metrics
from gateway.store import NewToolCall, PromptRecord, ToolCallRecord
from gateway.store.items import Verdict
from gateway.tools import NeedsAnswer, ToolContext, ToolSpec, run_tool
from gateway.traces.runs import RunTrace

log = logging.getLogger("gateway.agent.turn")

NO_ONE_TO_ASK = "No user can answer questions in this session."
NO_ANSWER = "No answer from the user."
RESTART_NOT_RERUN = "interrupted by a restart; not re-run"
RESTART_RERUN = "interrupted by a restart; run again (the tool has no side effects)"
BACKGROUND_WITH_VOICES = (
    "Tool call denied: a background task is not started from a request that holds other people's words "
    "({voices}). Delegate without background, or ask again in the requester's own words."
)
Settled = tuple[str, str]  # (status, result text) of one call
DelegateCalls = Callable[[list[OpenCall]], Awaitable[list[Settled]]]  # runs `delegate` calls (delegation.py)


def is_delegate_batch(calls: list[OpenCall]) -> bool:
    """A reply made only of synchronous delegate calls: their children run together."""
    return len(calls) >= 2 and all(c.name == DELEGATE and not c.args.get("background") for c in calls)


class ToolCalls:
    def __init__(
        self,
        services: TurnServices,
        request: TurnRequest,
        trace: RunTrace,
        *,
        thread: ThreadKey,
        stopper: Stopper,
        loop_guard: ToolLoopGuard,
        notice: Callable[[str], Awaitable[None]],
        tool_ran: Callable[[], None],
        auto_denied: list[str],
        delegate: DelegateCalls | None = None,
    ):
        self.services = services
        self.req = request
        self.session = request.session
        self.child = request.child
        self.trace = trace
        self.run_id = trace.run_id
        self.thread = thread  # where prompts and progress are shown (a child's: its root's chat)
        self.stopper = stopper
        self.loop_guard = loop_guard
        self.notice = notice
        self.tool_ran = tool_ran  # a tool may change the session's notes: the turn reads them again
        self.auto_denied = auto_denied
        self.delegate = delegate
        self.parent_seq: int | None = None  # the LLM response the calls being processed came from
        # call id -> its arguments as parsed and its tool as found when the round was recorded
        self._checked: dict[str, tuple[dict[str, Any], ToolSpec]] = {}
        self._files: Path | None = None
        self._began: dict[int, int] = {}  # tool call row id -> when its processing began (ns), for its span

    async def files_dir(self) -> Path:
        """The directory this turn's tools work in (its session's; a sub-agent's root's)."""
        if self._files is None:
            self._files = await files_dir(self.services.store, self.services.config.agent.workspace, self.session)
        return self._files

    # ---- what the model is offered and may call ------------------------------------------
    def offered(self) -> list[ToolSpec]:
        """The tools of this session's requests: the configured ones a child, the delegation
        depth and the approval rules leave it. The same whoever asks, so the array a provider
        caches with the prompt does not change with the speaker: what the person's role (or
        another voice's) does not allow is refused by name when called (`_gate`), and `refused`
        names it for the model."""
        specs = self.services.registry.specs(self.services.config.agent.tools)
        if self.child is not None:
            specs = [s for s in specs if self.child.may_use(s.name)]
        if self.services.delegation is not None:
            names = set(self.services.delegation.offered(self.child, [s.name for s in specs]))
            specs = [s for s in specs if s.name in names]
        hidden = self.services.policy.hidden_tools(specs, self.session.source)
        return [
            s
            for s in specs
            if s.name not in hidden
            and (self.session.interactive or "interactive_only" not in s.classes)
            and "command_only" not in s.classes  # opened by a chat command, never by the model
        ]

    def refused(self, names: list[str]) -> list[str]:
        """Those of `names` the person's role, or another voice's, does not allow this turn."""
        if self.services.access is None:
            return []
        return [n for n in names if self._role_denial(n) is not None or self._voice_denial(n) is not None]

    def offered_names(self) -> list[str]:
        return [s.name for s in self.offered()]

    def tool(self, name: str) -> ToolSpec | None:
        return self.services.registry.get(name) if self.child is None or self.child.may_use(name) else None

    def declare(self, call: DeclaredCall, cut_off: bool) -> NewToolCall:
        """A call of a round about to be recorded: pending when its tool exists and its
        arguments pass the schema (kept parsed for processing), else failed with a result that
        tells the model what to fix. The one place where an unknown tool is answered."""
        spec = self.tool(call.name)
        if spec is None:
            available = ", ".join(self.offered_names()) or "none"
            args = check_arguments(call.arguments, {"type": "object"}, cut_off=cut_off, tool_name=call.name)
            absent = self.services.registry.absent(call.name)  # e.g. its MCP server is restarting
            unknown = absent or f"Unknown tool {call.name!r}. Available tools: {available}."
            return NewToolCall(call.id, call.name, args.stored_arguments, status="failed", result=unknown)
        checked = check_arguments(call.arguments, spec.parameters, cut_off=cut_off, tool_name=call.name)
        if isinstance(checked, ArgumentsProblem):
            return NewToolCall(
                call.id, call.name, checked.stored_arguments, status="failed", result=checked.message_for_model
            )
        self._checked[call.id] = (checked.args, spec)
        return NewToolCall(call.id, call.name, checked.stored_arguments, status="pending")

    def _open(self, record: ToolCallRecord) -> OpenCall:
        checked = self._checked.pop(record.call_id, None)
        if checked is not None:
            return OpenCall(record, *checked)
        # Recorded by an earlier turn (parked, or cut short by a restart): checked then.
        return OpenCall(record, json.loads(record.arguments or "{}"), self.tool(record.name))

    # ---- processing ------------------------------------------------------------------------
    async def process(self, records: list[ToolCallRecord], *, parent_seq: int | None, fresh: bool = False) -> None:
        """Settle the open calls of the session in declared order; raises EndTurn to park or stop.
        `fresh`: the round just recorded them, so no prompt can be about them yet."""
        self.parent_seq = parent_seq
        calls = [self._open(record) for record in records]
        # A reply of only delegate calls, each let through by the gate: the children run together.
        together = self.delegate is not None and is_delegate_batch(calls)
        together = together and all([await self._cleared_to_delegate(call) for call in calls])
        delegated = await self.delegate(calls) if self.delegate is not None and together else None
        results: list[ToolResult] = []
        for i, call in enumerate(calls):
            status, text = delegated[i] if delegated is not None else await self._process(call, fresh)
            results.append(ToolResult(call.record.call_id, call.name, text, "failed" if status == "failed" else "ok"))
        declared = [DeclaredCall(c.record.call_id, c.name, c.record.arguments) for c in calls]
        verdict = self.loop_guard.record(declared, results)
        if verdict == "stop":
            raise EndTurn("FAILED", "tool_loop", message=END_MESSAGES["tool_loop"])
        if verdict == "notice":
            await self.notice(TOOL_LOOP_NOTICE)

    async def _process(self, call: OpenCall, fresh: bool) -> Settled:
        self._began[call.record.id] = telemetry.now_ns()
        if call.name == DELEGATE and self.delegate is not None and call.record.status == "running":
            return (await self.delegate([call]))[0]  # its children started (gated then): delegation.py
        if call.record.status == "running":  # a restart interrupted it mid-run
            ended = await self._ended_waiting(call.record)
            if ended is not None:  # it waited inside the call for an answer: the model decides
                return await self.settle(call.record, "failed", ended, decided=Decided("not_rerun"))
            if call.spec is not None and not call.spec.side_effects:
                return await self._execute(call, decided=Decided("rerun", via="policy", reason=RESTART_RERUN))
            return await self.settle(call.record, "failed", RESTART_NOT_RERUN, decided=Decided("not_rerun"))
        resumed_by = self.req.decided
        if resumed_by is not None and resumed_by.verdict.tool_call_id == call.record.id:
            return await self._apply_verdict(call, resumed_by.prompt, resumed_by.verdict)  # read on resume
        prompt = None if fresh else await self.services.store.prompts.for_tool_call(call.record.id)
        if prompt is not None:
            return await self._apply_verdict(call, prompt, Verdict.of(prompt))
        return await self._gate(call)

    async def _ended_waiting(self, call: ToolCallRecord) -> str | None:
        """The error for a call a restart caught waiting for an answer to a question asked inside
        it (gateway/approvals/in_call.py); its question is closed as expired. None otherwise."""
        prompt = await self.services.store.prompts.for_tool_call(call.id)
        error = restart_error(prompt) if prompt is not None else None
        if prompt is None or error is None:
            return None
        await self.services.prompts.end_in_call(prompt)
        return error

    async def _apply_verdict(self, call: OpenCall, prompt: PromptRecord, verdict: Verdict) -> Settled:
        if verdict.status == "pending":
            if prompt.run_id != self.run_id:  # asked by the run this one continues (cut by a restart)
                await self.services.store.prompts.move_to_run(prompt.id, self.run_id)
            await self._park(prompt)
        await self.services.prompts.close(prompt)
        decided = by_prompt(verdict, ThreadKey.parse(prompt.thread_key).channel)
        spans.approval_wait(prompt, decided)
        if verdict.kind == "question" and "resume" in prompt.payload:  # a tool's own question: it continues
            resume = {"state": prompt.payload["resume"], "status": verdict.status, "answer": verdict.answer}
            return await self._execute(call, resume=resume, decided=decided)
        if verdict.kind == "question":
            return await self._answered(call.record, verdict, decided)
        if verdict.status == "approved":
            return await self._execute(call, decided=decided)
        if verdict.status == "expired":
            text = rejection_text(EXPIRED)
        elif verdict.status == "canceled":
            canceled = placeholder_text("canceled")
            return await self.settle(call.record, "cancelled", canceled, note=canceled, decided=decided)
        else:
            text = rejection_text(verdict.answer)
        return await self.settle(call.record, "rejected", text, note=text, decided=decided)

    async def _answered(self, call: ToolCallRecord, verdict: Verdict, decided: Decided) -> Settled:
        """An ask_user question, decided."""
        if verdict.status == "answered":
            return await self.settle(call, "done", f"The user answered: {verdict.answer}", decided=decided)
        if verdict.status == "superseded":
            superseded = "This question was superseded by a newer question."
            return await self.settle(call, "done", superseded, decided=decided)
        if verdict.status == "canceled":
            return await self.settle(call, "cancelled", placeholder_text("canceled"), decided=decided)
        return await self.settle(call, "done", NO_ANSWER, decided=decided)

    def _role_denial(self, name: str) -> str | None:
        """The role's refusal of a tool (None when it allows it): the role of the person the
        turn acts for (a job made with `schedule` acts for its creator)."""
        access = self.services.access
        if access is None or access.tool_allowed(*self.req.acting(self.thread.channel), name):
            return None
        return access.role_name(*self.req.acting(self.thread.channel))

    def _voice_denial(self, name: str) -> tuple[Voice, str] | None:
        """The first other person whose words the turn holds and whose role does not allow the
        tool, with that role's name (gateway/agent/voices.py); None when all of them may use it."""
        access = self.services.access
        if access is None:
            return None
        channel = self.thread.channel
        for voice in self.req.voices:
            if not access.tool_allowed(channel, voice.rights_of, name):
                return voice, access.role_name(channel, voice.rights_of)
        return None

    async def _decide(self, call: OpenCall, spec: ToolSpec) -> PolicyDecision:
        # A standing approval covers the requests of the person it was given for, and only
        # while the turn holds nobody else's words (it is asked again, naming them).
        grants = [] if self.req.voices else await self.services.store.prompts.active_bypasses(str(self.thread))
        bypasses = [
            Bypass(b.tool, ThreadKey.parse(b.thread_key), b.expires_at)
            for b in grants
            if str(b.covers_person) == str(self.req.requested_by)
        ]
        in_context = None
        if spec.needs_approval_in is not None:  # e.g. a memory save in a turn that read a web page
            in_context = await spec.needs_approval_in(self.session.id, self.req.requested_by)
        return self.services.policy.decide(
            spec,
            call.args,
            source=self.session.source,
            interactive=self.session.interactive,
            bypasses=bypasses,
            thread=self.thread,
            in_context=in_context,
        )

    async def _cleared_to_delegate(self, call: OpenCall) -> bool:
        """A delegate call of a batch runs with the others only when the gate lets it through
        as it stands (else each goes through the gate on its own: a denial, a prompt)."""
        if call.record.status == "running":
            return True
        if call.spec is None or self._role_denial(call.name) is not None or self._voice_denial(call.name):
            return False
        return (await self._decide(call, call.spec)).action == "allow"

    async def _gate(self, call: OpenCall) -> Settled:
        if call.spec is None:
            return await self._execute(call)  # answers that the tool is gone
        role = self._role_denial(call.name)
        if role is not None:
            text = role_denial_text(call.name, role)
            return await self.settle(call.record, "rejected", text, note=text, decided=by_role(role))
        if call.name == DELEGATE and call.args.get("background") and self.req.voices:
            # A background task outlives the turn that knows whose words it holds: not started.
            text = BACKGROUND_WITH_VOICES.format(voices=described(self.req.voices))
            refused = Decided("denied", "voices", "policy", text)
            return await self.settle(call.record, "rejected", text, note=text, decided=refused)
        if (voiced := self._voice_denial(call.name)) is not None:
            voice, role = voiced
            text = denial_text(call.name, voice, role)
            return await self.settle(call.record, "rejected", text, note=text, decided=by_role(role, voice.name))
        if call.name == "ask_user":
            return await self._ask_user(call)
        decision = await self._decide(call, call.spec)
        if decision.action == "allow":
            return await self._execute(call, decided=by_policy(decision))
        if decision.action == "deny":
            reason = decision.reason
            return await self.settle(call.record, "rejected", reason, note=reason, decided=by_policy(decision))
        if decision.action == "auto_deny":
            return await self._auto_deny(call.record, by_policy(decision))
        prompt = await self.services.prompts.request_approval(
            self.session,
            self.thread,
            call.record,
            run_id=self.run_id,
            requested_by=self.req.requested_by,
            reason=decision.reason,
            grant=call.spec.grant_key,
            agent=self.child.name if self.child is not None else "",
            requester_name=self.req.requester_name,
            private=self.req.private,
            voices=described(self.req.voices),
            owner_decides=self._saves_to_own_memory(call.spec),
        )
        await self._park(prompt)

    def _saves_to_own_memory(self, spec: ToolSpec) -> bool:
        """A save into the requester's own memory (not a chat's, not a job's), held because the
        conversation read content nobody vouches for: theirs to confirm, as it is their memory."""
        scope = self.req.memory
        person = _person(*self.req.acting(self.thread.channel))
        return spec.needs_approval_in is not None and scope is not None and bool(person) and (
            scope.owner == f"person:{person}"
        )

    async def _auto_deny(self, call: ToolCallRecord, decided: Decided) -> Settled:
        self.auto_denied.append(f"{call.name}({shorten(call.arguments)})")
        metrics.APPROVALS.labels("auto_denied").inc()
        await self.trace.event("AUTO_DENIED", {"tool": call.name, "call_id": call.call_id, "arguments": call.arguments})
        return await self.settle(call, "rejected", AUTO_DENIED, note=AUTO_DENIED, decided=decided)

    async def _ask_user(self, call: OpenCall) -> Settled:
        if not self.session.interactive:
            return await self.settle(call.record, "done", NO_ONE_TO_ASK)
        args = call.args
        prompt = await self.services.prompts.ask(
            self.session, self.thread, call.record, run_id=self.run_id, requested_by=self.req.requested_by,
            question=str(args.get("question", "")), choices=[str(c) for c in args.get("choices") or []],
            allow_free_text=bool(args.get("allow_free_text", True)),
            agent=self.child.name if self.child is not None else "",
        )
        await self._park(prompt)

    async def _park(self, prompt: PromptRecord) -> NoReturn:
        await self.trace.event("AWAITING_INPUT", {"prompt_id": prompt.id, "kind": prompt.kind})
        raise EndTurn("AWAITING_INPUT", "awaiting_input", prompt_id=prompt.id)

    async def _execute(
        self, call: OpenCall, *, resume: dict[str, Any] | None = None, decided: Decided | None = None
    ) -> Settled:
        if call.spec is None:  # e.g. an MCP server went away since the call was recorded or approved
            unavailable = self.services.registry.absent(call.name) or f"The tool {call.name!r} is no longer available."
            return await self.settle(call.record, "failed", unavailable, decided=decided)
        if call.name == DELEGATE and self.delegate is not None:  # allowed: sub-agents (delegation.py)
            return (await self.delegate([call]))[0]
        record = call.record
        await self.services.store.sessions.set_tool_call(record.id, status="running", fence=self.req.fence)
        await self._show_progress(record)
        agent = self.services.config.agent
        ctx = ToolContext(
            session_id=self.session.id,
            thread=self.thread,
            source=self.session.source,
            interactive=self.session.interactive,
            workspace=await self.files_dir(),
            agent=agent,
            notes=self.services.store.sessions,
            services=self.services.tool_services,
            call_id=record.call_id,
            run_id=self.run_id,
            resume=resume,
            person=_person(*self.req.acting(self.thread.channel)),
            requested_by=self.req.requested_by,
            tool_call_id=record.id,
            fence=self.req.fence,
            memory=self.req.memory,
            private=self.child is None and (self.req.private or self.session.private),
            requester_name=self.req.requester_name,
            approved_by=_approver(decided),
        )
        started = time.monotonic()
        self.tool_ran()
        try:
            outcome = await interruptible(run_tool(call.spec, call.args, ctx), self.stopper)
        except Exception:  # stopped, or the tool broke: its card does not spin on
            await self._show_task(record, "error")
            raise
        if outcome.ask is not None:
            await self._show_task(record, "pending")
            await self._park_on_tool_question(record, outcome.ask)
        status = "failed" if outcome.failed else "done"
        await self._show_task(record, "error" if outcome.failed else "complete")
        traced = self.trace.tool_call_trace(
            name=record.name, call_id=record.call_id, status=status, duration_ms=(time.monotonic() - started) * 1000,
            parent_seq=self.parent_seq, detail={"arguments": record.arguments, "result": outcome.text},
        )
        return await self.settle(record, status, outcome.text, decided=decided, traced=traced)

    async def _park_on_tool_question(self, call: ToolCallRecord, ask: NeedsAnswer) -> NoReturn:
        """The tool asked the user (an MCP elicitation): the call waits, pending, on a question
        prompt like ask_user's, and runs again with the answer."""
        await self.services.store.sessions.set_tool_call(call.id, status="pending", fence=self.req.fence)
        prompt = await self.services.prompts.ask(
            self.session, self.thread, call, run_id=self.run_id, requested_by=self.req.requested_by,
            question=ask.question, choices=ask.choices, allow_free_text=ask.allow_free_text, resume=ask.state,
        )
        await self._park(prompt)

    async def _show_task(self, call: ToolCallRecord, status: str) -> None:
        """The call as a task card (Slack's native stream), for channels that show them."""
        channel = self.services.outbox.channels.get(self.thread.channel)
        show = getattr(channel, "show_task", None)
        if not self.session.interactive or show is None or self.child is not None:
            return
        try:
            await show(self.thread, call.call_id or str(call.id), call.name, status, shorten(call.arguments, 120))
        except Exception as exc:  # noqa: BLE001 - progress is cosmetic
            log.info("%s: task card not shown: %s", self.thread, exc)

    async def _show_progress(self, call: ToolCallRecord) -> None:
        """A "🔧 tool args" line, for channels that ask for it (the console; Telegram's
        `show_tool_progress`); a task card where the channel shows them."""
        await self._show_task(call, "in_progress")
        channel = self.services.outbox.channels.get(self.thread.channel)
        if not self.session.interactive or not getattr(channel, "show_tool_progress", False):
            return
        try:
            await self.services.outbox.send_text(
                self.thread, f"🔧 {call.name} {shorten(call.arguments, 80)}", key=f"progress:{call.id}"
            )
        except Exception as exc:  # noqa: BLE001 - progress is cosmetic
            log.info("%s: tool progress not shown: %s", self.thread, exc)

    async def settle(
        self,
        call: ToolCallRecord,
        status: str,
        text: str,
        *,
        note: str | None = None,
        decided: Decided | None = None,
        traced: tuple[list[tuple[str, dict[str, Any], int | None]], dict[str, Any]] | None = None,
    ) -> Settled:
        """The call's one result, with its row of the audit trail (and `traced`, the run's
        trace of it) in the same write."""
        audit = tool_call_entry(
            call, status, decided, thread=self.thread, requested_by=self.req.requested_by, run_id=self.run_id,
            agent=self.child.name if self.child is not None else None, voices=self.req.voices,
        )
        events, totals = traced or ([], None)
        await self.services.store.settle_tool_call(
            call.id, status=status, result=text, note=note, fence=self.req.fence, audit=audit,
            run_id=self.run_id, events=events, totals=totals,
        )
        metrics.TOOL_CALLS.labels(call.name, status).inc()
        spans.tool_call(call, status, decided, started_ns=self._began.pop(call.id, 0) or telemetry.now_ns())
        return status, text


def _person(channel: str, user: str) -> str:
    return f"{channel}:{user}" if user else ""


def _approver(decided: Decided | None) -> str:
    """Who let a call that needed a person run: the approver, or "bypass" for a standing approval."""
    if decided is None:
        return ""
    if decided.action == "approved":
        return decided.by or ""
    return "bypass" if decided.via == "bypass" else ""
