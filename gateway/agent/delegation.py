"""Sub-agents: the `delegate` tool, child sessions and their turns, and continuing them after a stop.

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
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.agent.child import ChildContext
from gateway.agent.child_control import ChildControl
from gateway.agent.delegate_tool import (
    BACKGROUND_STARTED,
    DELEGATE,
    ChildOutcome,
    call_result,
    child_max_tokens,
    done_line,
    outcome_of,
    start_line,
    task_name,
)
from gateway.agent.messages import EndTurn, OpenCall, TurnRequest, placeholder_text
from gateway.agent.services import TurnServices
from gateway.agent.tool_calls import RESTART_NOT_RERUN
from gateway.running.lifecycle import Interrupted
from gateway.store import ChildSession, LeaseLost, NewTask, SessionRecord, TaskRecord, ToolCallRecord
from gateway.traces.runs import RunTrace

if TYPE_CHECKING:
    from gateway.agent.turn import Turn

log = logging.getLogger(__name__)


@dataclass
class _Plan:
    call: ToolCallRecord
    tasks: list[TaskRecord] = field(default_factory=list)
    problem: str = ""  # the arguments were refused: the call's result


class Delegation:
    """Runs `delegate` calls for a turn; one per gateway (see TurnServices.delegation)."""

    def __init__(self, services: TurnServices, *, wake: Callable[[str], None] = lambda _key: None):
        self.services = services
        self.store = services.store
        self.cfg = services.config
        self.wake = wake  # the inbox's poke, so a new background task starts at once
        self.control = ChildControl(services, wake)  # what the inbox does with children

    # ---- what a turn offers and allows ----------------------------------------------------
    def offered(self, child: ChildContext | None, names: list[str]) -> list[str]:
        """The tools of a turn, `delegate` only where it may delegate."""
        depth = child.depth if child else 0
        return [n for n in names if n != DELEGATE or depth < self.cfg.agent.max_depth]

    # ---- running calls ---------------------------------------------------------------------
    async def run_calls(self, turn: Turn, calls: list[OpenCall]) -> list[tuple[str, str]]:
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
                results.append(await turn.calls.settle(plan.call, "failed", plan.problem))
            elif plan in background:
                text = BACKGROUND_STARTED.format(tasks=", ".join(f"task #{t.id} ({t.name})" for t in plan.tasks))
                results.append(await turn.calls.settle(plan.call, "done", text))
            else:
                tasks = await self.store.delegations.for_call(plan.call.id)
                results.append(await turn.calls.settle(plan.call, *call_result(tasks)))
        return results

    async def _plan(self, turn: Turn, opened: OpenCall) -> _Plan:
        call, args = opened.record, opened.args
        existing = await self.store.delegations.for_call(call.id)
        if existing:
            stale = [t.id for t in existing if t.parent_run_id != turn.run_id and not t.background]
            await self.store.delegations.set_parent_run(stale, turn.run_id)  # the parent continues in a new run
            return _Plan(call, existing)
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
                child_max_tokens(turn),
                session.schedule_id,  # a job's children count against its `scope: job` caps
                turn.model if turn.model != self.cfg.llm.model else None,  # the parent's model, for its children
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
            name = task_name(task.get("name"), i)
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
        return turn.calls.offered_names()

    async def _run_children(self, turn: Turn, plans: list[_Plan]) -> None:
        tasks = [t for p in plans for t in p.tasks]
        await self._reap_interrupted_batch(turn, tasks)
        slots = asyncio.Semaphore(self.cfg.agent.max_parallel_children)
        turns = self.services.turn_slots  # inbox.max_concurrent_turns: children are turns too

        async def one(task: TaskRecord) -> ChildOutcome:
            async with slots, _slot(turns):
                if turn.stopper.stopped:  # stopped while it waited for a slot: never started
                    return ChildOutcome("canceled", placeholder_text("canceled"))
                return await self._run_child(turn, task)

        open_tasks = [t for t in await self._current(tasks) if not t.finished]
        async with _lent(turns):  # the parent waits: its slot goes to its children meanwhile
            results = await asyncio.gather(*(one(t) for t in open_tasks), return_exceptions=True)
        ended = await self._collect(turn, open_tasks, results)
        if turn.stopper.stopped:
            raise Interrupted(turn.stopper.reason)
        parked = [o for o in ended if o.status == "parked"]
        if parked:
            assert turn.trace is not None
            await turn.trace.event("AWAITING_INPUT", {"prompt_id": parked[0].prompt_id, "kind": "child"})
            raise EndTurn("AWAITING_INPUT", "awaiting_input", prompt_id=parked[0].prompt_id)
        if any(o.status == "suspended" for o in ended):
            raise EndTurn("SUSPENDED", "shutdown")

    async def _collect(self, turn: Turn, tasks: list[TaskRecord], results: list[Any]) -> list[ChildOutcome]:
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
                crashed = ChildOutcome("failed", f"The sub-agent crashed: {type(result).__name__}: {result}")
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
            trace = RunTrace(self.store, run.id, config=self.cfg.traces, prices=self.cfg.llm.price_of)
            await trace.abandon("a parallel batch was interrupted; not re-run")
            await self._end(
                turn,
                task,
                ChildOutcome(
                    "failed", f"The sub-agent was {RESTART_NOT_RERUN} (its parallel batch was cut short by a restart)."
                ),
            )

    async def _run_child(self, turn: Turn, task: TaskRecord) -> ChildOutcome:
        from gateway.agent.turn import Turn  # the turn runs delegate calls: imported when one does

        session = await self.store.sessions.get(task.child_session_id)
        assert session is not None
        request = TurnRequest(
            session,
            turn.thread,
            requested_by=turn.req.requested_by,
            on_behalf_of=turn.req.on_behalf_of,  # a job's children act for its creator too
            fence=turn.req.fence,
            child=self.control.context(task, turn.thread),
            voices=turn.req.voices,  # the parent's words came with others': so do the child's
        )
        run = await self.store.runs.get(task.child_run_id) if task.child_run_id else None
        if run is None:
            model = self.cfg.llm.ref(session.model)
            voices = [v.as_json() for v in turn.req.voices]  # on its task row: found again when it resumes
            run, row = await self.store.delegations.begin(task, model=model, fence=turn.req.fence, voices=voices)
            request.started_run, request.turn_started_seq = run, row.seq
            await self.control.show(
                turn.thread, f"child-start:{task.id}", start_line(turn, task), interactive=turn.session.interactive
            )
        elif run.stage == "AWAITING_INPUT":  # parked: the prompt resuming the root may be its own
            request.parked_run, request.decided = run, turn.req.decided
        elif run.stage == "RUNNING":  # its worker died (or the gateway shut down): continue it
            new_run = await self.store.delegations.restart(task, run.id, model=self.cfg.llm.ref(session.model))
            request.started_run, request.continuing, request.continued_run = new_run, True, run.id
        else:  # it ended but the parent never saw it: the result is taken from the database
            return await self._end(turn, task, await self._outcome_of_ended(run.stage, run.error, session))
        # /stop reaches all: the child shares its parent's stopper
        child = Turn(self.services, request, drain=None, stopping=turn.stopping, stopper=turn.stopper)
        result = await child.run()
        return await self._end(turn, task, outcome_of(result))

    async def _outcome_of_ended(self, stage: str, error: str | None, session: SessionRecord) -> ChildOutcome:
        if stage == "SUCCESS":
            return ChildOutcome("done", await self.control.final_text(session.id))
        if stage == "CANCELED":
            return ChildOutcome("canceled", placeholder_text("canceled"))
        return ChildOutcome("failed", f"The sub-agent failed: {error or 'error'}.")

    async def _end(self, turn: Turn, task: TaskRecord, outcome: ChildOutcome) -> ChildOutcome:
        if outcome.status == "suspended":  # a shutdown: continued after the restart, not reaped
            await self.store.delegations.set_status(task.id, "suspended")
        if outcome.status in ("parked", "suspended"):
            return outcome
        if await self.store.delegations.finish(task, outcome.status, outcome.text, charge_run=turn.run_id):
            await self.control.show(
                turn.thread,
                f"child-done:{task.id}",
                done_line(turn, task, outcome),
                interactive=turn.session.interactive,
            )
        return outcome

    # ---- background tasks -----------------------------------------------------------------
    async def _announce_background(self, turn: Turn, plan: _Plan) -> None:
        for task in plan.tasks:
            await self.control.show(
                turn.thread, f"child-start:{task.id}", start_line(turn, task), interactive=turn.session.interactive
            )


@contextlib.asynccontextmanager
async def _slot(turns: asyncio.Semaphore | None) -> AsyncIterator[None]:
    if turns is None:
        yield
        return
    async with turns:
        yield


@contextlib.asynccontextmanager
async def _lent(turns: asyncio.Semaphore | None) -> AsyncIterator[None]:
    """The slot the waiting turn holds is free while its children run, and taken back after
    (shielded: a cancellation cannot leave the worker releasing a slot it does not hold)."""
    if turns is None:
        yield
        return
    turns.release()
    try:
        yield
    finally:
        await asyncio.shield(turns.acquire())
