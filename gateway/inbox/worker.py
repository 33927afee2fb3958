"""One thread's worker: while it holds the thread's lease it takes the next pending item and
handles it (a message, a command, a decided prompt's resume, a run to continue, a background
task), one at a time, in the order `next_item` gives. The turn itself runs in running.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.agent.messages import DecidedPrompt, TurnRequest
from gateway.agent.services import TurnServices
from gateway.agent.turn import turn_payer
from gateway.agent.voices import chatter_voices, of_rows, others, with_voices
from gateway.budgets import current_payer
from gateway.delivery import fencing
from gateway.events import StoreUnwritable, ThreadKey, links_in
from gateway.inbox.attached import MessageReadiness
from gateway.inbox.commands import Commands, is_stop
from gateway.inbox.holder import LeaseHolder
from gateway.inbox.running import TurnEnds, TurnListener, TurnRunner
from gateway.inbox.surroundings import kept_lines, led_by
from gateway.inbox.sweeper import deliver_left
from gateway.mcp.prompts import PROMPT_TOOL, PromptCall, call_arguments
from gateway.running.lifecycle import Stopper
from gateway.store import (
    Fence,
    InboxItem,
    Lease,
    LeaseLost,
    MessageRecord,
    NewToolCall,
    PromptRecord,
    SessionRecord,
    Store,
)
from gateway.store.items import ContinueRun, ResumePrompt, Said, Verdict, resumed, started_task

log = logging.getLogger("gateway.inbox.inbox")
PROMPT_WAITS = "⏳ Answer the request above first, then send the command again."
PICK_A_BUTTON = "⏳ Please answer the question above with one of its buttons."
NOT_YOUR_QUESTION = "⏳ The question above is waiting for the person it was asked of; your message comes after it."
WAITING_FOR_ADMIN = "⏳ Waiting for an admin's decision on the request above; your message comes after it."
WAITING_FOR_DECISION = (
    "⏳ Waiting for a decision on the request above. If you tap Deny, your message is used as the reason."
)
# Where a button is chosen by typing its number (the terminal), the notices say what to type.
PICK_A_NUMBER = "⏳ Please answer the question above: type the number of one of its choices."
WAITING_FOR_A_NUMBER = (
    "⏳ Waiting for a decision on the request above. If you choose Deny (type its number), your message is "
    "used as the reason."
)


class Worker:
    """Handles the items of the threads whose leases this instance holds (one task per thread)."""

    def __init__(
        self,
        store: Store,
        services: TurnServices,
        *,
        listeners: list[TurnListener],
        stopper: Stopper,
        slots: asyncio.Semaphore,
    ):
        self.store = store
        self.services = services
        self.config = services.config
        self.stopper = stopper
        self.slots = slots  # inbox.max_concurrent_turns
        self.others_waiting = False  # set by the dispatcher when it is saturated
        self.readiness = MessageReadiness(store, self.config.attachments, services.attachments)
        ends = TurnEnds(store, services, listeners)
        self.commands = Commands(store, services, ended=ends.report)
        self.runner = TurnRunner(
            store, services, self.readiness, ends, self.commands, admitted=self.admitted, stopper=stopper
        )

    async def work_thread(self, thread_key: str, lease: Lease) -> None:
        holder = LeaseHolder(self.store, lease, self.config.inbox.lease_ttl_s)
        renewer = asyncio.create_task(holder.keep(on_lost=lambda: self.runner.lost(thread_key)))
        fencing.hold(holder)  # this task's sends, and those of the tasks it starts, prove it first
        try:
            async with self.slots:
                state = self.runner.state(thread_key)
                if lease.unreleased:
                    await self._continue_left_runs(thread_key)
                await self._deliver_left_behind(ThreadKey.parse(thread_key), holder.fence)
                while not self.stopper.stopped and holder.valid:
                    before = state.pokes
                    items = await self.store.inbox.pending(thread_key, limit=50)
                    if not items:
                        break
                    item = next_item(items)
                    state.found(before, others_pending=len(items) > 1)  # the turn's steer and watch need not read again
                    await self.handle(ThreadKey.parse(thread_key), item, holder.fence)
                    if item.kind != "command" and self.others_waiting:
                        break  # fairness: the oldest waiting message, maybe another thread's, goes next
        except LeaseLost as exc:
            log.warning("%s: %s", thread_key, exc)
        except Exception:  # noqa: BLE001
            log.exception("%s: worker failed", thread_key)
        finally:
            holder.stopper.stop()
            await asyncio.gather(renewer, return_exceptions=True)
            if holder.valid:
                try:
                    await self.store.inbox.release(holder.lease)
                except StoreUnwritable:  # said by the store; the lease expires by itself, its runs are continued
                    log.debug("%s: the lease is left to expire: the database refuses writes", thread_key)
            self.runner.forget(thread_key)

    async def _deliver_left_behind(self, thread: ThreadKey, fence: Fence) -> None:
        """While the chat is held by a flood wait, what an earlier holder of the thread left
        pending (stopped or killed while its reply waited the hold out) goes before this
        holder's replies: both wait for the same hold, and the sweeper would take the row only
        `outbox.sweep_after_s` after it, once the thread is idle, so the newer answer would
        arrive first. (A row left without a hold is the sweeper's, as before: no read here.)"""
        if await self.services.outbox.pacer.held_now(thread) <= 0:
            return
        for row in await self.store.outbox.left_behind(str(thread), fence):
            await deliver_left(self.store, self.services.outbox, self.config.outbox, thread, row)

    async def _continue_left_runs(self, thread_key: str) -> None:
        """Runs that a holder of this thread which never released it (killed) left RUNNING
        are queued to continue first, ahead of the messages that wait behind them: each cut
        reply is finished before the next message is answered (continued after it, a cut run
        would answer from a history whose newest message is the later one)."""
        left = await self.store.runs.list(stage="RUNNING", thread_key=thread_key, limit=20)
        inline = await self.store.delegations.sync_child_sessions([r.session_id for r in left])
        oldest_first = sorted((r for r in left if r.session_id not in inline), key=lambda r: r.id)
        for run in oldest_first:
            await self.store.inbox.add_continuation(ContinueRun(run.id).item(thread_key), run.id)

    async def handle(self, thread: ThreadKey, item: InboxItem, fence: Fence) -> None:
        if item.payload.get("album_part"):  # its album's addressed part speaks for it, or nobody
            found = await self.readiness.addressed_part(thread, item, fence)
            if found is None:
                return
            item = found
        if item.kind in ("message", "command", "edit") and not await self.admitted(thread, item, fence):
            return
        if item.kind == "edit":  # of a message already answered (a queued one took the new text)
            await self._edited(thread, item, fence)
        elif item.kind == "command":
            await self._command(thread, item, fence)
        elif item.kind == "resume":
            # Done only once acted on: killed in between, the item is still pending for the next
            # holder (a parked run whose decided resume was lost would wait for good).
            what = resumed(item)
            if isinstance(what, ContinueRun):
                await self._continue(thread, what, fence)
            else:
                await self._resume(thread, what, fence)
            await self.store.inbox.finish([item.id], fence=fence)
        elif item.kind == "task":
            await self._task(thread, item, fence)
        else:
            await self._message(thread, item, fence)

    async def admitted(self, thread: ThreadKey, item: InboxItem, fence: Fence | None) -> bool:
        """Whether the sender may talk here; if not, the item is held (pairing pending) or
        dropped, and the sender told what the gatekeeper says (a pairing code, a refusal)."""
        gatekeeper = self.services.gatekeeper
        if gatekeeper is None:
            return True
        said = Said.of(item)
        admission = await gatekeeper.admit(thread, said, command=item.kind == "command")
        if admission.allowed:
            return True
        if admission.reply:
            await self.services.outbox.send_text(
                thread, admission.reply, key=f"access:{item.id}", reply_to=said.message_id
            )
        if admission.hold and admission.request_id is not None:
            held = await self.store.inbox.hold_for_access(item.id, admission.request_id, fence=fence)
            if held == "approved":
                return True  # approved since the gatekeeper looked: answered now
            if held == "held":
                return False
        await self.store.inbox.finish([item.id], status="dropped", fence=fence)
        return False

    async def _edited(self, thread: ThreadKey, item: InboxItem, fence: Fence) -> None:
        mode = self.config.inbox.on_edit
        if mode == "reply":
            await self._message(thread, item, fence)
        elif mode == "note":
            await self.store.conversation.note(item.id)
        else:
            await self.store.inbox.finish([item.id], fence=fence)

    async def _message(self, thread: ThreadKey, item: InboxItem, fence: Fence) -> None:
        said = Said.of(item)
        before = await self.store.before_message(str(thread))
        pending, current = before.prompts, before.session
        questions = [p for p in pending if p.kind == "question"]
        typed_answers = questions and questions[-1].payload.get("allow_free_text", True) and item.kind == "message"
        theirs = bool(questions) and self.services.prompts.may_decide(questions[-1], said.sender.id)
        if typed_answers and theirs and await self.services.prompts.answer_with_text(
            questions[-1], said.text, sender_id=said.sender.id, sender_name=said.sender.name
        ):
            await self.store.inbox.finish([item.id], fence=fence)
            return
        if pending and self.services.delegation is not None:  # a background task's approval holds only the task
            pending = await self.services.delegation.control.holding(pending)
        # An approval, a question that only takes a button, or someone else's: the turn waits
        # (unless it was decided since it was read: then the message is handled now).
        if pending and await self.store.inbox.hold_while_waiting(item.id, [p.id for p in pending]):
            deciding = any(
                p.kind == "approval" and self.services.prompts.may_decide(p, said.sender.id) for p in pending
            )
            typed = getattr(self.services.outbox.channels.get(thread.channel), "typed_buttons", False)
            notice = waiting_notice(pending, question_is_theirs=theirs, decides=deciding, typed=typed)
            await self.services.outbox.send_text(thread, notice, key=f"held:{item.id}", reply_to=said.message_id)
            return
        # Decided since this item was read: the resumed turn goes first, this one after it. A
        # prompt pending at that read may have been decided since (while held above): read again.
        if before.resume_waits or (
            before.prompts and await self.store.inbox.count_pending(str(thread), kinds=["resume"])
        ):
            return
        session = current or await self.store.sessions.open(
            str(thread), source=thread.channel, started_by=said.sender.id, private=said.private
        )
        on_behalf_of = await self._job_creator(session)
        # Its files' transcriptions are spent for whom the turn will be (the spend caps).
        paying = current_payer.set(turn_payer(session, thread, said.sender.id, on_behalf_of))
        try:
            ready = await self.readiness.ready(thread, [item], session.id)
        finally:
            current_payer.reset(paying)
        ready = await self._with_kept_context(thread, item, ready)
        model = await self.commands.models.for_turn(thread, session, item, on_behalf_of)  # checked against the role
        started = await self.store.start_turn(session.id, str(thread), ready, model=model.ref, fence=fence)
        request = TurnRequest(
            session,
            thread,
            requested_by=said.sender.id,
            requester_name=said.sender.name or said.sender.username,
            private=said.private,
            on_behalf_of=on_behalf_of,
            reply_to=said.message_id,
            links=links_in(said.text),
            fence=fence,
            turn_started_seq=started.rows[0].seq,
            started_run=started.run,
            voices=others([v for _, p in ready for v in p.get("voices") or ()], said.sender.id),
        )
        await self.runner.run(request)

    async def _command(self, thread: ThreadKey, item: InboxItem, fence: Fence) -> None:
        prompt = self.commands.prompt_call(item)
        if isinstance(prompt, PromptCall):
            await self._prompt_turn(thread, item, fence, prompt)
        elif prompt is not None:
            await self.commands.refuse_now(thread, item, prompt)  # what to write instead, in one line
        else:
            await self.commands.handle(thread, item, fence)

    async def _prompt_turn(self, thread: ThreadKey, item: InboxItem, fence: Fence, prompt: PromptCall) -> None:
        """An MCP prompt's command starts a turn: the command as typed is the person's message,
        and the turn opens with an `mcp_prompt` call whose result (the server's messages, or a
        question for a missing argument first) the model then acts on."""
        said = Said.of(item)
        before = await self.store.before_message(str(thread))
        if before.prompts or before.resume_waits:
            await self.commands.refuse_now(thread, item, PROMPT_WAITS)
            return
        session = before.session or await self.store.sessions.open(
            str(thread), source=thread.channel, started_by=said.sender.id, private=said.private
        )
        model = await self.commands.models.for_turn(thread, session, item, "")
        ready = [(item.id, dict(item.payload))]
        started = await self.store.start_turn(session.id, str(thread), ready, model=model.ref, fence=fence)
        call = NewToolCall(f"cmd-{item.id}", PROMPT_TOOL, call_arguments(prompt), status="pending")
        await self.store.record_round(session.id, "", run_id=started.run.id, calls=[call], fence=fence)
        request = TurnRequest(
            session,
            thread,
            requested_by=said.sender.id,
            requester_name=said.sender.name or said.sender.username,
            private=said.private,
            reply_to=said.message_id,
            fence=fence,
            turn_started_seq=started.rows[0].seq,
            started_run=started.run,
            opens_with_calls=True,
        )
        await self.runner.run(request)

    async def _with_kept_context(
        self, thread: ThreadKey, item: InboxItem, ready: list[tuple[int, dict[str, Any]]]
    ) -> list[tuple[int, dict[str, Any]]]:
        """The group's unaddressed chatter kept since (`group_context`), and edits of answered
        messages noted (`inbox.on_edit: note`), lead the turn's message; their items are done with it."""
        where = str(item.payload.get("surroundings") or thread)
        chatter, notes = await self.store.conversation.kept(where, str(thread))
        chatter = [i for i in chatter if i.id < item.id]
        if not ready or not (chatter or notes):
            return ready
        item_id, payload = ready[0]
        voices = chatter_voices([*chatter, *notes], Said.of(item).sender.id)  # their words: their rights too
        payload = with_voices(led_by(payload, kept_lines(chatter, notes)), voices)
        payload["context_items"] = [i.id for i in (*chatter, *notes)]
        return [(item_id, payload), *ready[1:]]

    async def _resume(self, thread: ThreadKey, resume: ResumePrompt, fence: Fence) -> None:
        """A decided prompt: its parked run continues. The prompt and the run are read here, once,
        and handed to the turn, which applies the verdict to the call and closes the prompt (its
        message shows the outcome), once, wherever the run goes on."""
        prompt = await self.store.prompts.get(resume.prompt_id)
        session = await self.store.sessions.get(prompt.session_id) if prompt else None
        if prompt is None or session is None or prompt.run_id is None:
            return
        verdict = resume.verdict or Verdict.of(prompt)  # None: an item written before items carried it
        run_id, child = prompt.run_id, None
        if session.kind == "child" and self.services.delegation is not None:  # the turn running it continues
            handed = ResumePrompt(prompt.id, verdict)
            routed = await self.services.delegation.control.route(session, run_id, thread, handed)
            if routed is None:
                return  # handed over to its background task's thread
            session, run_id, child = routed
        run = await self.store.runs.get(run_id)
        if run is None or run.stage != "AWAITING_INPUT":
            return  # the turn was stopped or already resumed
        turn = await self._turn_of(session.id, run.id)
        request = TurnRequest(
            session,
            thread,
            requested_by=prompt.requested_by,
            requester_name=str(prompt.payload.get("requester_name") or ""),
            private=bool(prompt.payload.get("private")),
            parked_run=run,
            decided=DecidedPrompt(verdict, prompt),
            fence=fence,
            turn_started_seq=turn.seq,
            child=child,
            voices=of_rows(turn.rows, prompt.requested_by),
        )
        await self.runner.run(request)

    async def _task(self, thread: ThreadKey, item: InboxItem, fence: Fence) -> None:
        """A background child's first turn, on its own thread (see gateway/agent/delegation.py).
        The item is done in the write that starts the child's run: a crash before it leaves the
        item to start the task again, never a task that nothing starts."""
        control = self.services.delegation.control if self.services.delegation is not None else None
        request = await control.start_background(started_task(item), thread, fence) if control else None
        if request is None:
            await self.store.inbox.finish([item.id], fence=fence)  # ended or started already: nothing to do
            return
        await self.runner.run(request)

    async def _continue(self, thread: ThreadKey, left: ContinueRun, fence: Fence) -> None:
        """A run a stopped worker left RUNNING ends failed; a new run continues its turn."""
        run = await self.store.runs.get(left.run_id)
        session = await self.store.sessions.get(run.session_id) if run else None
        if run is None or session is None or run.stage != "RUNNING":
            return
        turn = await self._turn_of(session.id, run.id)
        asker = turn.asker()
        new_run = await self.store.runs.continue_in_new_run(
            run.id, "the worker running this turn stopped; continuing in a new run", model=run.model, fence=fence
        )
        if new_run is None:
            return
        delegation = self.services.delegation
        child = await delegation.control.context_of(session) if delegation is not None else None
        request = TurnRequest(
            session,
            thread,
            requested_by=(requested_by := asker[0] if asker is not None else session.started_by),
            requester_name=asker[1] if asker is not None else "",
            on_behalf_of=await self._job_creator(session),
            fence=fence,
            turn_started_seq=turn.seq,
            continuing=True,
            continued_run=run.id,
            child=child,
            voices=of_rows(turn.rows, requested_by),
            started_run=new_run,
        )
        await self.runner.run(request)

    async def _job_creator(self, session: SessionRecord) -> str:
        """The person a scheduled run acts for: a job made with the `schedule` tool runs with its
        creator's role (`<channel>:<user id>`); a job made by the operator (config, CLI) as the
        trusted scheduler (""). A job the agent made before creators were recorded acts for
        nobody known: the default role of its chat's channel (fail closed)."""
        if session.schedule_id is None:
            return ""
        schedule = await self.store.schedules.get(session.schedule_id)
        if schedule is None or schedule.source != "agent":
            return ""
        creator = schedule.created_by or ""
        if creator.count(":") == 1 and creator.split(":")[1]:
            return creator
        return f"{ThreadKey.channel_of(schedule.deliver_to or creator) or 'unknown'}:?"

    async def _turn_of(self, session_id: int, run_id: int) -> TurnStart:
        """The user row that started the run's turn: the last one at or before the run's
        first row; a run that continues a cut one (after kill -9) may have no row of its own
        yet: then the last one of all. (Never a row after it: the builder would take the
        turn's own message for an unanswered one and drop it.) With the turn's rows from it on."""
        history = await self.store.sessions.history(session_id)
        if not history:
            return TurnStart(1, [])
        first = next((m.seq for m in history if m.run_id == run_id), history[-1].seq)
        users = [m.seq for m in history if m.role == "user" and not m.synthetic and m.seq <= first]
        seq = users[-1] if users else first
        return TurnStart(seq, [m for m in history if m.seq >= seq])


@dataclass(frozen=True)
class TurnStart:
    """Where a parked or cut turn began, read again to continue it."""

    seq: int
    rows: list[MessageRecord]  # its rows, from its first user row on: their voices

    def asker(self) -> tuple[str, str] | None:
        """Who asked for the turn (its first row's sender), to continue it as them: a turn
        continued after a restart keeps its requester's role, grants and approvers, not the
        identity of whoever started the session."""
        row = self.rows[0] if self.rows else None
        if row is None or row.seq != self.seq or row.role != "user" or not row.sender_id:
            return None
        return row.sender_id, row.sender_name or ""


def waiting_notice(
    pending: Sequence[PromptRecord], *, question_is_theirs: bool, decides: bool = True, typed: bool = False
) -> str:
    """`typed`: the channel's buttons are chosen by typing their number (Channel.typed_buttons)."""
    if any(p.kind == "approval" for p in pending):
        if not decides:
            return WAITING_FOR_ADMIN
        return WAITING_FOR_A_NUMBER if typed else WAITING_FOR_DECISION
    if not question_is_theirs:
        return NOT_YOUR_QUESTION
    return PICK_A_NUMBER if typed else PICK_A_BUTTON


def next_item(items: list[InboxItem]) -> InboxItem:
    """A /stop before anything queued ahead of it (which it drops unhandled); then resume items
    (a decided prompt continues its turn); then arrival order."""
    stop = next((i for i in items if is_stop(i)), None)
    if stop is not None:
        return stop
    resumes = [i for i in items if i.kind == "resume"]
    return resumes[0] if resumes else items[0]
