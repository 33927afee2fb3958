"""Sub-agents seen from the inbox: a background task's turns, where a child's decided prompt
continues, what /stop and /status do with children, and the chat lines."""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway.agent.child import ChildContext
from gateway.agent.delegate_tool import DONE_PREVIEW_CHARS, ChildOutcome, outcome_of, report_item, status_icon
from gateway.agent.messages import TurnOutcome, TurnRequest, placeholder_text, shorten
from gateway.agent.services import TurnServices
from gateway.events import ThreadKey
from gateway.store import Fence, PromptRecord, SessionRecord, TaskRecord
from gateway.store.delegations import TASK_CHANNEL
from gateway.store.items import ResumePrompt, StartTask, command_item

log = logging.getLogger("gateway.agent.delegation")


class ChildControl:
    def __init__(self, services: TurnServices, wake: Callable[[str], None]):
        self.services = services
        self.store = services.store
        self.cfg = services.config
        self.wake = wake  # the inbox's poke, so what was queued for a thread is looked at at once

    async def final_text(self, session_id: int) -> str:
        history = await self.store.sessions.history(session_id)
        finals = [m for m in history if m.role == "assistant" and not m.tool_calls and m.status == "ok"]
        return finals[-1].content if finals else ""

    async def start_background(self, start: StartTask, lease_thread: ThreadKey, fence: Fence) -> TurnRequest | None:
        """The turn of a background task's inbox item (None when it already ended or started);
        the item is done in the write that starts the child's run."""
        task = await self.store.delegations.get(start.task_id)
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
            return None  # already started: resume items and continue items go on with it
        model = self.cfg.llm.ref(session.model)
        run, row = await self.store.delegations.begin(task, model=model, fence=fence, item_id=start.item_id)
        request.started_run, request.turn_started_seq, request.fence = run, row.seq, fence
        return request

    async def background_ended(self, request: TurnRequest, result: TurnOutcome) -> None:
        """A background child's turn ended: unless it only parked, its result goes back to the
        parent's thread as a message (queued with the task's end, once)."""
        child = request.child
        if child is None or not child.background or result.stage in ("AWAITING_INPUT", "SUSPENDED", "LOST"):
            return
        task = await self.store.delegations.get(child.task_id)
        if task is None:
            return
        outcome = outcome_of(result)
        if outcome.status == "done" and not outcome.text:
            outcome.text = await self.final_text(request.session.id)
        report = report_item(task, outcome)
        # What it spent counts for the run that started it (ended since, most likely), like a
        # foreground child's: in that run's totals, so in its session's /cost and its job's.
        charged = task.parent_run_id
        if await self.store.delegations.finish(task, outcome.status, outcome.text, charge_run=charged, report=report):
            self.wake(task.thread_key)
            await self.show(
                child.chat,
                f"child-done:{task.id}",
                f"{status_icon(outcome.status)} {task.name} finished (background task #{task.id}) → "
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
        self, session: SessionRecord, run_id: int, thread: ThreadKey, resume: ResumePrompt
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
                        [resume.item(task.task_thread, handed_over=True)]
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
                task.id, text, report=report_item(task, ChildOutcome("canceled", text))
            ):
                self.wake(task.thread_key)
            else:
                await self.store.inbox.add(
                    [command_item(f"stop:{stop_item_id}:{task.id}", task.task_thread, "/stop")]
                )
                self.wake(task.task_thread)
            stopped += 1
        return stopped

    async def holding(self, prompts: list[PromptRecord]) -> list[PromptRecord]:
        """The pending prompts that hold a thread's new messages: not a background task's (the
        conversation goes on while it waits for its decision)."""
        held = []
        for prompt in prompts:
            session = await self.store.sessions.get(prompt.session_id)
            if session is None or ThreadKey.channel_of(session.thread_key) != TASK_CHANNEL:
                held.append(prompt)
        return held

    async def status_lines(self, session_id: int) -> list[str]:
        lines = []
        for task in await self.store.delegations.of_session(session_id, open_only=True):
            kind = "background task" if task.background else "sub-agent"
            lines.append(f"• {kind} #{task.id} {task.name}: {task.status}")
        return lines

    async def show(self, thread: ThreadKey, key: str, text: str, *, interactive: bool = True) -> None:
        """A progress line in the chat (nobody watches a scheduled run: nothing there)."""
        if not self.cfg.agent.show_children or not interactive or thread.channel not in self.services.outbox.channels:
            return
        try:
            await self.services.outbox.send_text(thread, text, key=key)
        except Exception as exc:  # noqa: BLE001 - progress lines are cosmetic
            log.info("%s: child progress not shown: %s", thread, exc)
