"""Sub-agents: the `delegate` tool, child sessions and their turns, and their recovery.

Each task of a `delegate` call is a child session with its own history and run, recorded in the
`delegations` table with its parent's session, run and tool call. A synchronous child runs inside
the parent's turn (same lease, same stopper, the same turn loop); several of them, from one call
or from a reply made only of `delegate` calls, run concurrently and are recorded in call order. A
background child is an inbox item of its own thread (`task:<id>`), so any instance may run it, and
its end queues a report into the parent's thread. Children are shown in the parent's chat: their
approvals and questions are the parent chat's prompts, decided by its approvers.

Everything is driven by the database, so parking, resuming and continuing after a crash are the
same code: an open `delegate` call looks at its task rows and each child's run to decide what
to do (start, resume, continue, or take the result already there).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.agent.child import ChildContext
from gateway.agent.rounds import placeholder_text
from gateway.agent.tool_calls import RESTART_NOT_RERUN, TurnEnd, shorten
from gateway.events import ThreadKey
from gateway.lifecycle import Interrupted
from gateway.store import ChildSession, LeaseLost, NewItem, NewTask, SessionRecord, TaskRecord, ToolCallRecord
from gateway.tools import ToolError, ToolSpec

if TYPE_CHECKING:
    from gateway.agent.turn import Turn, TurnRequest, TurnResult, TurnServices

log = logging.getLogger(__name__)

DELEGATE = "delegate"
MAX_TASKS = 8
START_PREVIEW_CHARS = 300
DONE_PREVIEW_CHARS = 200
BACKGROUND_STARTED = (
    "Started in the background: {tasks}. Each one's result will come back to this conversation as a "
    "message when it ends; do not wait for it or call delegate again for it."
)
ROOT_NAME = "agent"

DELEGATE_DESCRIPTION = (
    "Hand tasks to sub-agents. Each task runs as a separate agent with its own conversation, "
    "starting from `prompt` alone (include everything it needs to know), using `tools` (a subset "
    "of yours; default: all of yours except delegate). Several tasks run at the same time. By "
    "default you wait and get each sub-agent's final answer as the result; with background: true "
    "the call returns at once and each result comes back later as a message."
)


def delegate_spec() -> ToolSpec:
    async def never_run(ctx, args):  # noqa: ANN001, ANN202
        raise ToolError("delegate runs sub-agents through the turn, not directly")

    return ToolSpec(
        name=DELEGATE,
        description=DELEGATE_DESCRIPTION,
        parameters={
            "type": "object",
            "properties": {
                "tasks": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_TASKS,
                    "items": {
                        "type": "object",
                        "properties": {
                            "prompt": {
                                "type": "string",
                                "description": "The task, with all the context the sub-agent needs.",
                            },
                            "tools": {
                                "type": "array",
                                "items": {"type": "string"},
                                "description": "Tool names it may use.",
                            },
                            "name": {"type": "string", "description": "A short name shown in the chat, e.g. research."},
                        },
                        "required": ["prompt"],
                        "additionalProperties": False,
                    },
                },
                "background": {
                    "type": "boolean",
                    "default": False,
                    "description": "Return at once; results come back as messages.",
                },
            },
            "required": ["tasks"],
            "additionalProperties": False,
        },
        func=never_run,
    )


def is_background(call: ToolCallRecord) -> bool:
    try:
        return bool(json.loads(call.arguments or "{}").get("background"))
    except (ValueError, AttributeError):
        return False


@dataclass
class _Outcome:
    """How one child's turn (or what the database already held) ended."""

    status: str  # done | failed | canceled | parked | suspended
    text: str = ""
    prompt_id: int | None = None
    auto_denied: tuple[str, ...] = ()


@dataclass
class _Plan:
    call: ToolCallRecord
    tasks: list[TaskRecord] = field(default_factory=list)
    problem: str = ""  # the arguments were refused: the call's result


class Delegation:
    """Runs `delegate` calls for a turn; one per gateway (see TurnServices.delegation)."""

    def __init__(self, services: TurnServices, *, wake: Callable[[str], None] = lambda _key: None):
        self.s = services
        self.store = services.store
        self.cfg = services.config
        self.wake = wake  # the inbox's poke, so a new background task starts at once

    # ---- what a turn offers and allows ----------------------------------------------------
    def offered(self, turn: Turn, names: list[str]) -> list[str]:
        """The tools of a turn, `delegate` only where it may delegate."""
        child: ChildContext | None = turn.child
        depth = child.depth if child else 0
        return [n for n in names if n != DELEGATE or depth < self.cfg.agent.max_depth]

    def is_batch(self, calls: list[ToolCallRecord]) -> bool:
        """A reply made only of synchronous delegate calls: their children run together."""
        return len(calls) >= 2 and all(c.name == DELEGATE and not is_background(c) for c in calls)

    # ---- running calls ---------------------------------------------------------------------
    async def run_calls(self, turn: Turn, calls: list[ToolCallRecord]) -> list[tuple[str, str]]:
        """Settle delegate calls; their children run concurrently, results in call order."""
        plans = [await self._plan(turn, call) for call in calls]
        background = [p for p in plans if not p.problem and p.tasks and p.tasks[0].background]
        for plan in background:
            await self._announce_background(turn, plan)
        waiting = [p for p in plans if not p.problem and p.tasks and not p.tasks[0].background]
        if waiting:
            await self._run_children(turn, waiting)
        results = []
        for plan in plans:
            if plan.problem:
                results.append(await turn._settle(plan.call, "failed", plan.problem))
            elif plan in background:
                text = BACKGROUND_STARTED.format(tasks=", ".join(f"task #{t.id} ({t.name})" for t in plan.tasks))
                results.append(await turn._settle(plan.call, "done", text))
            else:
                tasks = await self.store.delegations.for_call(plan.call.id)
                results.append(await turn._settle(plan.call, *_call_result(tasks)))
        return results

    async def _plan(self, turn: Turn, call: ToolCallRecord) -> _Plan:
        existing = await self.store.delegations.for_call(call.id)
        if existing:
            stale = [t.id for t in existing if t.parent_run_id != turn.run_id and not t.background]
            await self.store.delegations.set_parent_run(stale, turn.run_id)  # the parent continues in a new run
            return _Plan(call, existing)
        args = json.loads(call.arguments or "{}")
        problem, tasks = self._check(turn, args)
        if problem:
            return _Plan(
                call, problem=f"Invalid arguments for delegate: {problem}. Fix the arguments and call delegate again."
            )
        background = bool(args.get("background"))
        session = turn.session
        depth = (turn.child.depth if turn.child else 0) + 1
        created = await self.store.delegations.create(
            parent_session_id=session.id,
            parent_run_id=turn.run_id,
            parent_tool_call_id=call.id,
            thread_key=str(turn.thread),
            tasks=tasks,
            depth=depth,
            background=background,
            fence=turn.req.fence,
            child=ChildSession(
                session.source,
                session.interactive,
                turn.req.requested_by or session.started_by,
                session.max_rounds,
                _remaining_tokens(turn),
            ),
        )
        if background:
            for task in created:
                self.wake(task.task_thread)
        await self.store.sessions.set_tool_call(call.id, status="running", fence=turn.req.fence)
        return _Plan(call, created)

    def _check(self, turn: Turn, args: dict[str, Any]) -> tuple[str, list[NewTask]]:
        allowed = self._allowed(turn)
        depth = (turn.child.depth if turn.child else 0) + 1
        if args.get("background") and (not turn.session.interactive or turn.child is not None):
            return (
                "background tasks can only be started from an interactive conversation (not from a sub-agent "
                "or a scheduled run); use background: false",
                [],
            )
        tasks = []
        for i, task in enumerate(args.get("tasks") or []):
            prompt = str(task.get("prompt", "")).strip()
            if not prompt:
                return f"tasks[{i}].prompt is empty", []
            name = _name(task.get("name"), i)
            asked = task.get("tools")
            if asked is None:
                tools = [t for t in allowed if t != DELEGATE]
            else:
                unknown = [str(t) for t in asked if t not in allowed]
                if unknown:
                    return (
                        f"tasks[{i}].tools: {', '.join(unknown)} not available "
                        f"(you may give: {', '.join(allowed) or 'none'})",
                        [],
                    )
                tools = list(dict.fromkeys(str(t) for t in asked))
            if depth >= self.cfg.agent.max_depth:
                tools = [t for t in tools if t != DELEGATE]  # a child at the depth limit is not offered delegate
            tasks.append(NewTask(name, prompt, tuple(tools)))
        if not tasks:
            return "give at least one task", []
        return "", tasks

    def _allowed(self, turn: Turn) -> list[str]:
        return [tool["function"]["name"] for tool in turn._offered_tools()]

    async def _run_children(self, turn: Turn, plans: list[_Plan]) -> None:
        tasks = [t for p in plans for t in p.tasks]
        await self._reap_interrupted_batch(turn, tasks)
        slots = asyncio.Semaphore(self.cfg.agent.max_parallel_children)

        async def one(task: TaskRecord) -> _Outcome:
            async with slots:
                return await self._run_child(turn, task)

        open_tasks = [t for t in await self._current(tasks) if not t.finished]
        results = await asyncio.gather(*(one(t) for t in open_tasks), return_exceptions=True)
        ended = await self._collect(turn, open_tasks, results)
        if turn.stopper.stopped:
            raise Interrupted(turn.stopper.reason)
        parked = [o for o in ended if o.status == "parked"]
        if parked:
            assert turn.trace is not None
            await turn.trace.event("AWAITING_INPUT", {"prompt_id": parked[0].prompt_id, "kind": "child"})
            raise TurnEnd("AWAITING_INPUT", "awaiting_input", prompt_id=parked[0].prompt_id)
        if any(o.status == "suspended" for o in ended):
            raise TurnEnd("SUSPENDED", "shutdown")

    async def _collect(self, turn: Turn, tasks: list[TaskRecord], results: list[Any]) -> list[_Outcome]:
        """The children's outcomes; one that crashed is failed (its siblings' results stand)."""
        for result in results:
            if isinstance(result, LeaseLost) or (
                isinstance(result, BaseException) and not isinstance(result, Exception)
            ):
                raise result  # the lease is gone or the task is cancelled: nothing more may be written
        ended = []
        for task, result in zip(tasks, results, strict=True):
            if isinstance(result, Exception):
                log.error("child %s failed: %r", task.id, result, exc_info=result)
                crashed = _Outcome("failed", f"The sub-agent crashed: {type(result).__name__}: {result}")
                ended.append(await self._end(turn, task, crashed))
                continue
            turn.auto_denied.extend(f"{task.name}: {denied}" for denied in result.auto_denied)
            ended.append(result)
        return ended

    async def _current(self, tasks: list[TaskRecord]) -> list[TaskRecord]:
        fresh = []
        for task in tasks:
            fresh.append(await self.store.delegations.get(task.id) or task)
        return fresh

    async def _reap_interrupted_batch(self, turn: Turn, tasks: list[TaskRecord]) -> None:
        """Two or more children whose worker died mid-run: a parallel batch a crash cut short is
        failed, not silently run again; the parent's model is told and decides."""
        dead = []
        for task in tasks:
            if task.status != "running" or task.child_run_id is None:
                continue
            run = await self.store.runs.get(task.child_run_id)
            if run is not None and run.stage == "RUNNING":
                dead.append((task, run))
        if len(dead) < 2:
            return
        for task, run in dead:
            await self.store.runs.add_event(
                run.id, "RUN_ERROR", {"stage": "restart", "message": "a parallel batch was interrupted; not re-run"}
            )
            await self.store.runs.set_stage(run.id, "FAILED", end_reason="error", error="restart")
            await self._end(
                turn,
                task,
                _Outcome(
                    "failed", f"The sub-agent was {RESTART_NOT_RERUN} (its parallel batch was cut short by a restart)."
                ),
            )

    async def _run_child(self, turn: Turn, task: TaskRecord) -> _Outcome:
        from gateway.agent.turn import Turn, TurnRequest

        session = await self.store.sessions.get(task.child_session_id)
        assert session is not None
        request = TurnRequest(
            session,
            turn.thread,
            requested_by=turn.req.requested_by,
            fence=turn.req.fence,
            child=self.context(task, turn.thread),
        )
        run = await self.store.runs.get(task.child_run_id) if task.child_run_id else None
        if run is None:
            run, row = await self.store.delegations.begin(task, model=self.cfg.llm.model, fence=turn.req.fence)
            request.started_run, request.turn_started_seq = run, row.seq
            await self._show(
                turn.thread, f"child-start:{task.id}", _start_line(turn, task), interactive=turn.session.interactive
            )
        elif run.stage == "AWAITING_INPUT":
            request.run_id = run.id
        elif run.stage == "RUNNING":  # its worker died (or the gateway shut down): continue it
            new_run = await self.store.delegations.restart(task, run.id, model=self.cfg.llm.model)
            request.started_run, request.continuing, request.continued_run = new_run, True, run.id
        else:  # it ended but the parent never saw it: the result is taken from the database
            return await self._end(turn, task, await self._outcome_of_ended(run.stage, run.error, session))
        child = Turn(self.s, request, drain=None, stopping=turn.stopping)
        child.stopper = turn.stopper  # /stop reaches every child at once
        result = await child.run()
        return await self._end(turn, task, self._outcome(result))

    async def _outcome_of_ended(self, stage: str, error: str | None, session: SessionRecord) -> _Outcome:
        if stage == "SUCCESS":
            return _Outcome("done", await self._final_text(session.id))
        if stage == "CANCELED":
            return _Outcome("canceled", placeholder_text("canceled"))
        return _Outcome("failed", f"The sub-agent failed: {error or 'error'}.")

    async def _final_text(self, session_id: int) -> str:
        history = await self.store.sessions.history(session_id)
        finals = [m for m in history if m.role == "assistant" and not m.tool_calls and m.status == "ok"]
        return finals[-1].content if finals else ""

    @staticmethod
    def _outcome(result: TurnResult) -> _Outcome:
        if result.stage == "SUCCESS":
            return _Outcome("done", result.reply, auto_denied=result.auto_denied)
        if result.stage == "AWAITING_INPUT":
            return _Outcome("parked", prompt_id=result.prompt_id, auto_denied=result.auto_denied)
        if result.stage == "SUSPENDED":
            return _Outcome("suspended")
        if result.stage == "LOST":
            raise LeaseLost(result.error or "lease lost")
        if result.stage == "CANCELED":
            return _Outcome("canceled", placeholder_text("canceled"), auto_denied=result.auto_denied)
        why = result.error or result.end_reason
        return _Outcome("failed", f"The sub-agent stopped without an answer ({why}).", auto_denied=result.auto_denied)

    async def _end(self, turn: Turn, task: TaskRecord, outcome: _Outcome) -> _Outcome:
        if outcome.status == "suspended":  # a shutdown: continued after the restart, not reaped
            await self.store.delegations.set_status(task.id, "suspended")
        if outcome.status in ("parked", "suspended"):
            return outcome
        if await self.store.delegations.finish(task, outcome.status, outcome.text, charge_run=turn.run_id):
            await self._show(
                turn.thread,
                f"child-done:{task.id}",
                _done_line(turn, task, outcome),
                interactive=turn.session.interactive,
            )
        return outcome

    # ---- background tasks -----------------------------------------------------------------
    async def _announce_background(self, turn: Turn, plan: _Plan) -> None:
        for task in plan.tasks:
            await self._show(
                turn.thread, f"child-start:{task.id}", _start_line(turn, task), interactive=turn.session.interactive
            )

    async def start_background(self, task_id: int, lease_thread: ThreadKey) -> TurnRequest | None:
        """The turn of a background task's inbox item (None when it already ended)."""
        from gateway.agent.turn import TurnRequest

        task = await self.store.delegations.get(task_id)
        if task is None or task.finished or task.child_session_id is None:
            return None
        session = await self.store.sessions.get(task.child_session_id)
        parent = await self.store.sessions.get(task.parent_session_id)
        if session is None or parent is None:
            return None
        chat = ThreadKey.parse(task.thread_key)
        request = TurnRequest(session, lease_thread, requested_by=session.started_by, child=self.context(task, chat))
        run = await self.store.runs.get(task.child_run_id) if task.child_run_id else None
        if run is not None:
            return None  # already started: resume items and crash recovery continue it
        run, row = await self.store.delegations.begin(task, model=self.cfg.llm.model)
        request.started_run, request.turn_started_seq = run, row.seq
        return request

    async def background_ended(self, request: TurnRequest, result: TurnResult) -> None:
        """A background child's turn ended: unless it only parked, its result goes back to the
        parent's thread as a message (queued with the task's end, once)."""
        child = request.child
        if child is None or not child.background or result.stage in ("AWAITING_INPUT", "SUSPENDED", "LOST"):
            return
        task = await self.store.delegations.get(child.task_id)
        if task is None:
            return
        outcome = self._outcome(result)
        if outcome.status == "done" and not outcome.text:
            outcome.text = await self._final_text(request.session.id)
        report = _report(task, outcome)
        if await self.store.delegations.finish(task, outcome.status, outcome.text, charge_run=None, report=report):
            self.wake(task.thread_key)
            await self._show(
                child.chat,
                f"child-done:{task.id}",
                f"{_status_icon(outcome.status)} {task.name} finished (background task #{task.id}) → "
                f"{shorten(outcome.text, DONE_PREVIEW_CHARS)}",
            )

    # ---- resuming, stopping, reporting -----------------------------------------------------
    def context(self, task: TaskRecord, chat: ThreadKey) -> ChildContext:
        return ChildContext(task.id, task.name, task.depth, frozenset(task.tools), chat, task.background)

    async def context_of(self, session: SessionRecord) -> ChildContext | None:
        """The child context of a background task's session (for its thread's worker)."""
        if session.kind != "child":
            return None
        task = await self.store.delegations.by_child_session(session.id)
        if task is None or not task.background:
            return None
        return self.context(task, ThreadKey.parse(task.thread_key))

    async def route(
        self, session: SessionRecord, run_id: int, thread: ThreadKey, prompt_id: int
    ) -> tuple[SessionRecord, int, ChildContext | None] | None:
        """A decided prompt of a child continues the turn that runs it: the root of its chain of
        synchronous parents (on this thread) or the background task it belongs to (on the
        task's own thread, where the resume is handed over; None then)."""
        while session.kind == "child":
            task = await self.store.delegations.by_child_session(session.id)
            if task is None:
                break
            if task.background:
                if str(thread) != task.task_thread:
                    await self.store.inbox.add(
                        [NewItem(f"resume:{prompt_id}:task", task.task_thread, "resume", {"prompt_id": prompt_id})]
                    )
                    self.wake(task.task_thread)
                    return None
                return session, run_id, self.context(task, ThreadKey.parse(task.thread_key))
            parent = await self.store.sessions.get(task.parent_session_id)
            if parent is None or task.parent_run_id is None:
                break
            session, run_id = parent, task.parent_run_id
        return session, run_id, None

    async def chain(self, run_id: int) -> list[int]:
        """A parked child's run and its synchronous parents' runs, up to the root."""
        runs = [run_id]
        run = await self.store.runs.get(run_id)
        while run is not None:
            task = await self.store.delegations.by_child_session(run.session_id)
            if task is None or task.background or task.parent_run_id is None:
                break
            await self.store.delegations.finish(
                task, "canceled", placeholder_text("canceled"), charge_run=task.parent_run_id
            )
            runs.append(task.parent_run_id)
            run = await self.store.runs.get(task.parent_run_id)
        return runs

    async def stop_background(self, session_id: int, stop_item_id: int) -> int:
        """/stop in a thread also stops its background tasks: one not started yet ends at once
        (and reports); a running one gets a /stop in its own thread, on whichever instance runs it."""
        stopped = 0
        for task in await self.store.delegations.of_session(session_id, open_only=True):
            if not task.background:
                continue
            text = placeholder_text("canceled")
            if await self.store.delegations.cancel_pending(
                task.id, text, report=_report(task, _Outcome("canceled", text))
            ):
                self.wake(task.thread_key)
            else:
                await self.store.inbox.add(
                    [NewItem(f"stop:{stop_item_id}:{task.id}", task.task_thread, "command", {"text": "/stop"})]
                )
                self.wake(task.task_thread)
            stopped += 1
        return stopped

    async def status_lines(self, session_id: int) -> list[str]:
        lines = []
        for task in await self.store.delegations.of_session(session_id, open_only=True):
            kind = "background task" if task.background else "sub-agent"
            lines.append(f"• {kind} #{task.id} {task.name}: {task.status}")
        return lines

    async def _show(self, thread: ThreadKey, key: str, text: str, *, interactive: bool = True) -> None:
        """A progress line in the chat (nobody watches a scheduled run: nothing there)."""
        if not self.cfg.agent.show_children or not interactive or thread.channel not in self.s.outbox.channels:
            return
        try:
            await self.s.outbox.send_text(thread, text, key=key)
        except Exception as exc:  # noqa: BLE001 - progress lines are cosmetic
            log.info("%s: child progress not shown: %s", thread, exc)


def _name(value: Any, index: int) -> str:
    text = "".join(ch for ch in str(value or "").strip() if ch.isalnum() or ch in "-_ ")[:40].strip()
    return text or f"task {index + 1}"


def _remaining_tokens(turn: Turn) -> int | None:
    return turn.session.max_tokens  # the run's budget check counts what the children used


def _parent_name(turn: Turn) -> str:
    return turn.child.name if turn.child else ROOT_NAME


def _start_line(turn: Turn, task: TaskRecord) -> str:
    where = " (background)" if task.background else ""
    return f"🤖 {_parent_name(turn)} → {task.name}{where}\n> {shorten(task.prompt, START_PREVIEW_CHARS)}"


def _status_icon(status: str) -> str:
    return {"done": "✅", "canceled": "⏹"}.get(status, "⚠️")


def _done_line(turn: Turn, task: TaskRecord, outcome: _Outcome) -> str:
    preview = shorten(outcome.text, DONE_PREVIEW_CHARS)
    return f"{_status_icon(outcome.status)} {task.name} finished → {_parent_name(turn)}: {preview}"


def _call_result(tasks: list[TaskRecord]) -> tuple[str, str]:
    """One delegate call's result: the single child's answer, or each child's in task order."""
    if len(tasks) == 1:
        task = tasks[0]
        return ("done" if task.status == "done" else "failed"), task.result or "(no answer)"
    parts = [f"[{i + 1}] {t.name} ({t.status}):\n{t.result or '(no answer)'}" for i, t in enumerate(tasks)]
    status = "done" if any(t.status == "done" for t in tasks) else "failed"
    return status, "\n\n".join(parts)


def _report(task: TaskRecord, outcome: _Outcome) -> NewItem:
    verb = {"done": "finished", "canceled": "was stopped"}.get(outcome.status, "failed")
    text = f"[Background task #{task.id} ({task.name}) {verb}]\n{outcome.text or '(no answer)'}"
    sender = {"id": "delegate", "name": task.name, "username": ""}
    return NewItem(
        f"task-report:{task.id}",
        task.thread_key,
        "report",
        {"text": text, "sender": sender, "task_id": task.id, "message_id": ""},
    )
