"""The durable per-thread inbox and its workers.

`submit` commits events before it returns (channels confirm to the platform only after).
A dispatcher finds threads with pending items and takes each thread's lease (a database row
with a fencing token), so exactly one worker on one instance processes a thread, in arrival
order, while different threads run concurrently under `inbox.max_concurrent_turns`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway import metrics
from gateway.agent.messages import TurnOutcome, TurnRequest
from gateway.agent.services import TurnServices
from gateway.agent.turn import Turn
from gateway.events import (
    ButtonPress,
    InboundEvent,
    InboundMessage,
    SubmitResult,
    ThreadKey,
    TurnEnded,
)
from gateway.inbox.attached import MessageReadiness
from gateway.inbox.commands import IMMEDIATE, INTERRUPTING, CommandSteps, is_stop, parse_command
from gateway.inbox.sweeper import OutboxSweeper
from gateway.lifecycle import Stopper
from gateway.store import Fence, InboxItem, Lease, LeaseLost, NewItem, PromptRecord, Store, notify

log = logging.getLogger(__name__)
TurnListener = Callable[[TurnEnded], Awaitable[None]]
MAINTENANCE_EVERY_S = 5.0
WATCH_POLL_S = 1.0
PICK_A_BUTTON = "⏳ Please answer the question above with one of its buttons."
NOT_YOUR_QUESTION = "⏳ The question above is waiting for the person it was asked of; your message comes after it."
WAITING_FOR_DECISION = (
    "⏳ Waiting for a decision on the request above. If you tap Deny, your message is used as the reason."
)


def default_instance_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def event_item(event: InboundMessage) -> NewItem:
    command = parse_command(event.text)
    payload: dict[str, Any] = {
        "text": event.text,
        "sender": {"id": event.sender.id, "name": event.sender.name, "username": event.sender.username},
        "attachments": [a.__dict__ for a in event.attachments],
        "message_id": event.message_id,
        "received_at": event.received_at.isoformat(),
        **({"group": event.group} if event.group else {}),
    }
    if event.private:
        payload["private"] = True  # a direct message: the access check treats it as a person's DM
    return NewItem(event.event_id, str(event.thread), "command" if command else "message", payload)


@dataclass
class _Running:
    task: asyncio.Task
    turn: Turn


@dataclass
class _ThreadState:
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    running: _Running | None = None


class Inbox(CommandSteps):
    def __init__(
        self,
        store: Store,
        services: TurnServices,
        *,
        instance_id: str | None = None,
        listeners: Sequence[TurnListener] = (),
    ):
        self.store = store
        self.s = services
        self.config = services.config
        self.instance_id = instance_id or self.config.serve.instance_id or default_instance_id()
        self.listeners = list(listeners)
        self._threads: dict[str, _ThreadState] = {}
        self._workers: dict[str, asyncio.Task] = {}
        self._slots = asyncio.Semaphore(self.config.inbox.max_concurrent_turns)
        self._wake = asyncio.Event()
        self._dispatcher: asyncio.Task | None = None
        self._stopper = Stopper()
        self._others_waiting = False
        self.readiness = MessageReadiness(store, self.config.attachments, services.attachments)
        self.sweeper = OutboxSweeper(
            store,
            services.outbox,
            self.config.outbox,
            instance_id=self.instance_id,
            lease_ttl_s=self.config.inbox.lease_ttl_s,
        )
        self._sweeping: asyncio.Task | None = None
        self._listening = asyncio.Event()  # set: stop listening for other instances' wake-ups
        self._listener: asyncio.Task | None = None

    # ---- intake --------------------------------------------------------------------------
    async def submit(
        self, events: Sequence[InboundEvent], *, cursor: tuple[str, str] | None = None
    ) -> list[SubmitResult]:
        """Commit the events (duplicates ignored) and the cursor; only then return.

        Shielded: a channel task cancelled meanwhile (a poller stopping, a client hanging up)
        does not interrupt the write; a redelivery of what was committed is a no-op."""
        return await asyncio.shield(self._submit(events, cursor))

    async def _submit(self, events: Sequence[InboundEvent], cursor: tuple[str, str] | None) -> list[SubmitResult]:
        results: dict[str, SubmitResult] = {}
        for event in events:
            if isinstance(event, ButtonPress):
                results[event.event_id] = await self._press(event)
                if results[event.event_id].duplicate:
                    metrics.DUPLICATES.labels(event.thread.channel).inc()
                else:
                    metrics.INBOUND.labels(event.thread.channel, "button").inc()
        messages = [e for e in events if isinstance(e, InboundMessage)]
        if messages or cursor is not None:
            created = await self.store.inbox.add([event_item(e) for e in messages], cursor=cursor)
            for event, new in zip(messages, created, strict=False):
                results[event.event_id] = SubmitResult(event.event_id, duplicate=not new)
                if new:
                    kind = "command" if parse_command(event.text) else "message"
                    metrics.INBOUND.labels(event.thread.channel, kind).inc()
                else:
                    metrics.DUPLICATES.labels(event.thread.channel).inc()
        for event in events:
            self._poke(str(event.thread))
        presses = {str(e.thread) for e in events if isinstance(e, ButtonPress)}
        await notify.publish(self.store.db, presses)  # a decided prompt's resume item (messages: in `add`)
        return [results[e.event_id] for e in events]

    def poke(self, thread_key: str) -> None:
        """Something was queued for this thread: look at once (not at the next poll)."""
        self._poke(thread_key)

    async def _press(self, press: ButtonPress) -> SubmitResult:
        gatekeeper = self.s.gatekeeper
        if gatekeeper is None or not gatekeeper.handles(press):
            return await self.s.prompts.press(press)
        result, woken = await gatekeeper.press(press)
        if woken is not None:
            self._poke(woken)  # its held messages are queued again
        return result

    def _poke(self, thread_key: str) -> None:
        self._state(thread_key).wake.set()
        self._wake.set()

    def _state(self, thread_key: str) -> _ThreadState:
        return self._threads.setdefault(thread_key, _ThreadState())

    def running_turn(self, session_id: int) -> Turn | None:
        """The turn this instance is running for a session, if any."""
        for state in self._threads.values():
            if state.running is not None and state.running.turn.session.id == session_id:
                return state.running.turn
        return None

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        await self.recover()
        self._dispatcher = asyncio.create_task(self._dispatch_forever(), name="inbox-dispatcher")
        self._listener = asyncio.create_task(
            notify.listen(self.store.db, self._poke, self._listening), name="inbox-listener"
        )

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop taking threads; running turns end at a round boundary (or park) within the
        grace period; whatever remains is cancelled and continued by the next start."""
        self._stopper.stop("shutdown")
        self._wake.set()
        if self._dispatcher is not None:
            await asyncio.gather(self._dispatcher, return_exceptions=True)
        self._listening.set()
        if self._listener is not None:
            await asyncio.gather(self._listener, return_exceptions=True)
        if self._sweeping is not None:
            self._sweeping.cancel()
            await asyncio.gather(self._sweeping, return_exceptions=True)
        grace = grace_s if grace_s is not None else self.config.serve.shutdown_grace
        workers = list(self._workers.values())
        if workers:
            await asyncio.wait(workers, timeout=grace)
        for state in self._threads.values():
            if state.running is not None:
                state.running.turn.request_stop("shutdown")  # suspended; continued after the restart
        if workers:
            _, stuck = await asyncio.wait(workers, timeout=10)
            for task in stuck:  # last resort: a worker that ignores the stop
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        await self.store.inbox.release_all(self.instance_id)

    async def recover(self) -> int:
        """Runs left RUNNING by a dead worker are continued: a continue item per run whose
        thread lease is free (a live instance's runs are left alone)."""
        count = 0
        running = await self.store.runs.list(stage="RUNNING", limit=1000)
        inline = await self.store.delegations.sync_child_sessions([r.session_id for r in running])
        for run in running:
            if run.session_id in inline:
                continue  # a child inside its parent's turn: continued by the parent's turn
            if await self.store.inbox.lease_holder(f"thread:{run.thread_key}") is not None:
                continue
            item = NewItem(f"continue:{run.id}", run.thread_key, "resume", {"continue_run": run.id})
            if (await self.store.inbox.add([item]))[0]:
                count += 1
                self._poke(run.thread_key)
        return count

    async def drain_idle(self, timeout: float = 30.0) -> None:
        """Wait until nothing is pending or running (tests and the console)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if not self._workers and await self.store.inbox.count_pending() == 0:
                return
            await asyncio.sleep(0.02)
        raise TimeoutError("the inbox did not become idle")

    # ---- dispatch ------------------------------------------------------------------------
    async def _dispatch_forever(self) -> None:
        loop = asyncio.get_running_loop()
        next_maintenance = 0.0
        while not self._stopper.stopped:
            try:
                if loop.time() >= next_maintenance:
                    next_maintenance = loop.time() + min(MAINTENANCE_EVERY_S, self.config.outbox.sweep_after_s)
                    await self._maintenance()
                await self._dispatch_once()
            except Exception:  # noqa: BLE001 - keep dispatching through database hiccups
                log.exception("inbox dispatch failed; retrying")
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self.config.inbox.poll_interval_s)
            except TimeoutError:
                pass

    async def _maintenance(self) -> None:
        await self.s.prompts.expire_due()
        if self.s.gatekeeper is not None:
            await self.s.gatekeeper.expire_due()
        if self.s.spend is not None:
            await self.s.spend.sweep()
        await self.recover()
        if self._sweeping is None or self._sweeping.done():  # off the dispatcher: a send may wait
            self._sweeping = asyncio.create_task(self._sweep(), name="outbox-sweeper")

    async def _sweep(self) -> None:
        try:
            await self.sweeper.sweep()
        except Exception:  # noqa: BLE001 - the next round of maintenance tries again
            log.exception("outbox sweep failed")

    async def _dispatch_once(self) -> None:
        free = self.config.inbox.max_concurrent_turns - len(self._workers)
        if free <= 0:
            # Saturated: tell busy workers whether other threads wait, so they hand over their
            # slot after the current turn instead of draining their own queue first.
            self._others_waiting = bool(await self.store.inbox.pending_threads(limit=1, exclude=list(self._workers)))
            return
        self._others_waiting = False
        for thread_key in await self.store.inbox.pending_threads(limit=free * 2, exclude=list(self._workers)):
            if len(self._workers) >= self.config.inbox.max_concurrent_turns:
                break
            lease = await self.store.inbox.acquire(
                f"thread:{thread_key}", self.instance_id, self.config.inbox.lease_ttl_s
            )
            if lease is None:
                continue  # another instance holds it
            task = asyncio.create_task(self._work_thread(thread_key, lease), name=f"thread {thread_key}")
            self._workers[thread_key] = task
            task.add_done_callback(functools.partial(self._worker_done, thread_key))

    def _worker_done(self, thread_key: str, _task: asyncio.Task[None]) -> None:
        self._workers.pop(thread_key, None)
        self._wake.set()

    # ---- one thread ----------------------------------------------------------------------
    async def _work_thread(self, thread_key: str, lease: Lease) -> None:
        holder = _LeaseHolder(self.store, lease, self.config.inbox.lease_ttl_s)
        renewer = asyncio.create_task(holder.keep(on_lost=lambda: self._lost(thread_key)))
        try:
            async with self._slots:
                while not self._stopper.stopped and holder.valid:
                    items = await self.store.inbox.pending(thread_key, limit=50)
                    if not items:
                        break
                    item = _next_item(items)
                    await self._handle(ThreadKey.parse(thread_key), item, holder.fence)
                    if item.kind != "command" and self._others_waiting:
                        break  # fairness: the oldest waiting message, maybe another thread's, goes next
        except LeaseLost as exc:
            log.warning("%s: %s", thread_key, exc)
        except Exception:  # noqa: BLE001
            log.exception("%s: worker failed", thread_key)
        finally:
            holder.stopper.stop()
            await asyncio.gather(renewer, return_exceptions=True)
            if holder.valid:
                await self.store.inbox.release(holder.lease)

    def _lost(self, thread_key: str) -> None:
        running = self._state(thread_key).running
        if running is not None:
            running.turn.request_stop("lease lost")

    async def _handle(self, thread: ThreadKey, item: InboxItem, fence: Fence) -> None:
        if item.kind in ("message", "command") and not await self._admitted(thread, item, fence):
            return
        if item.kind == "command":
            await self._command(thread, item, fence)
        elif item.kind == "resume":
            await self._resume(thread, item, fence)
        elif item.kind == "task":
            await self._task(thread, item, fence)
        else:
            await self._message(thread, item, fence)

    async def _admitted(self, thread: ThreadKey, item: InboxItem, fence: Fence | None) -> bool:
        """Whether the sender may talk here; if not, the item is held (pairing pending) or
        dropped, and the sender told what the gatekeeper says (a pairing code, a refusal)."""
        gatekeeper = self.s.gatekeeper
        if gatekeeper is None:
            return True
        admission = await gatekeeper.admit(thread, item.payload, command=item.kind == "command")
        if admission.allowed:
            return True
        if admission.reply:
            reply_to = item.payload.get("message_id", "")
            await self.s.outbox.send_text(thread, admission.reply, key=f"access:{item.id}", reply_to=reply_to)
        if admission.hold:
            await self.store.inbox.hold(item.id)
        else:
            await self.store.inbox.finish([item.id], status="dropped", fence=fence)
        return False

    async def _message(self, thread: ThreadKey, item: InboxItem, fence: Fence) -> None:
        sender = item.payload.get("sender") or {}
        thread_key = str(thread)
        pending = await self.store.prompts.pending(thread_key=thread_key)
        questions = [p for p in pending if p.kind == "question"]
        text = str(item.payload.get("text", ""))
        typed_answers = questions and questions[-1].payload.get("allow_free_text", True) and item.kind == "message"
        theirs = bool(questions) and self.s.prompts.may_decide(questions[-1], str(sender.get("id", "")))
        if typed_answers and theirs and await self.s.prompts.answer_with_text(
            questions[-1], text, sender_id=sender.get("id", ""), sender_name=sender.get("name", "")
        ):
            await self.store.inbox.finish([item.id], fence=fence)
            return
        if pending and self.s.delegation is not None:  # a background task's approval holds only the task
            pending = await self.s.delegation.control.holding(pending)
        if pending:  # an approval, a question that only takes a button, or someone else's: the turn waits
            notice = _waiting_notice(pending, question_is_theirs=theirs)
            await self.store.inbox.hold(item.id)
            await self.s.outbox.send_text(
                thread, notice, key=f"held:{item.id}", reply_to=item.payload.get("message_id", "")
            )
            return
        session = await self._session(thread, started_by=sender.get("id", ""))
        ready = await self.readiness.ready(thread, [item], session.id)
        started = await self.store.start_turn(session.id, thread_key, ready, model=self.config.llm.model, fence=fence)
        request = TurnRequest(
            session,
            thread,
            requested_by=sender.get("id", ""),
            reply_to=item.payload.get("message_id", ""),
            fence=fence,
            turn_started_seq=started.rows[0].seq,
            started_run=started.run,
        )
        await self._run_turn(request)

    async def _resume(self, thread: ThreadKey, item: InboxItem, fence: Fence) -> None:
        await self.store.inbox.finish([item.id], fence=fence)
        if "continue_run" in item.payload:
            await self._continue(thread, int(item.payload["continue_run"]), fence)
            return
        prompt = await self.store.prompts.get(int(item.payload["prompt_id"]))
        session = await self.store.sessions.get(prompt.session_id) if prompt else None
        if prompt is None or session is None or prompt.run_id is None:
            return
        await self.s.prompts.close(prompt)
        run_id, child = prompt.run_id, None
        if session.kind == "child" and self.s.delegation is not None:  # the turn running it continues
            routed = await self.s.delegation.control.route(session, run_id, thread, prompt.id)
            if routed is None:
                return  # handed over to its background task's thread
            session, run_id, child = routed
        run = await self.store.runs.get(run_id)
        if run is None or run.stage != "AWAITING_INPUT":
            return  # the turn was stopped or already resumed
        request = TurnRequest(
            session,
            thread,
            requested_by=prompt.requested_by,
            run_id=run.id,
            fence=fence,
            turn_started_seq=await self._turn_start(session.id, run.id),
            child=child,
        )
        await self._run_turn(request)

    async def _task(self, thread: ThreadKey, item: InboxItem, fence: Fence) -> None:
        """A background child's first turn, on its own thread (see gateway/agent/delegation.py)."""
        await self.store.inbox.finish([item.id], fence=fence)
        if self.s.delegation is None:
            return
        request = await self.s.delegation.control.start_background(int(item.payload["task_id"]), thread)
        if request is not None:
            request.fence = fence
            await self._run_turn(request)

    async def _continue(self, thread: ThreadKey, run_id: int, fence: Fence) -> None:
        run = await self.store.runs.get(run_id)
        session = await self.store.sessions.get(run.session_id) if run else None
        if run is None or session is None or run.stage != "RUNNING":
            return
        await self.store.runs.add_event(
            run.id,
            "RUN_ERROR",
            {"stage": "restart", "message": "the worker running this turn stopped; continuing in a new run"},
        )
        await self.store.runs.set_stage(run.id, "FAILED", end_reason="error", error="restart")
        child = await self.s.delegation.control.context_of(session) if self.s.delegation is not None else None
        request = TurnRequest(
            session,
            thread,
            requested_by=session.started_by,
            fence=fence,
            turn_started_seq=await self._turn_start(session.id, run.id),
            continuing=True,
            continued_run=run.id,
            child=child,
        )
        await self._run_turn(request)

    async def _turn_start(self, session_id: int, run_id: int) -> int:
        history = await self.store.sessions.history(session_id)
        first = next((m.seq for m in history if m.run_id == run_id), None)
        if first is None:
            return history[-1].seq if history else 1
        previous_user = [m.seq for m in history if m.role == "user" and m.seq < first]
        return previous_user[-1] if previous_user else first

    async def _session(self, thread: ThreadKey, *, started_by: str):  # noqa: ANN202
        current = await self.store.sessions.current(str(thread))
        if current is not None:
            return current
        return await self.store.sessions.open(str(thread), source=thread.channel, started_by=started_by)

    # ---- running a turn ------------------------------------------------------------------
    async def _run_turn(self, request: TurnRequest) -> None:
        thread_key = str(request.thread)
        state = self._state(thread_key)
        turn = Turn(self.s, request, drain=self._drainer(request), stopping=lambda: self._stopper.stopped)
        channel = self.s.outbox.channels.get(request.thread.channel)
        await _set_busy(channel, request.thread, True, request.reply_to)
        task = asyncio.create_task(turn.run(), name=f"turn {thread_key}")
        state.running = _Running(task, turn)
        watching = Stopper()
        watcher = asyncio.create_task(self._watch(request.thread, state.running, watching))
        try:
            result = await task
        finally:
            watching.stop()
            state.wake.set()
            await asyncio.gather(watcher, return_exceptions=True)
            state.running = None
            await _set_busy(channel, request.thread, False, request.reply_to)
        await self._after_turn(request, result)

    async def _after_turn(self, request: TurnRequest, result: TurnOutcome) -> None:
        if result.stage == "SUSPENDED":
            await self.store.inbox.add(
                [NewItem(f"continue:{result.run_id}", str(request.thread), "resume", {"continue_run": result.run_id})]
            )
            return
        if result.stage == "LOST":
            return
        if request.child is not None:  # a background child: its result goes back to its parent
            await self.s.delegation.control.background_ended(request, result)
            return
        run = await self.store.runs.get(result.run_id)
        event = TurnEnded(
            request.thread,
            request.session.id,
            result.run_id,
            result.stage,
            result.end_reason,
            result.reply,
            result.auto_denied,
            result.error,
            (run.input_tokens + run.output_tokens) if run else 0,
            run.cost_nano_usd if run else None,
        )
        for listener in self.listeners:
            try:
                await listener(event)
            except Exception:  # noqa: BLE001
                log.exception("turn listener failed for %s", request.thread)

    def _drainer(self, request: TurnRequest) -> Callable[[], Awaitable[int]] | None:
        if self.config.inbox.busy_mode_for(request.thread.channel) != "steer" or request.child is not None:
            return None

        async def drain() -> int:
            """Steer: messages that arrived during the turn join it at the round boundary."""
            pending = await self.store.inbox.pending(str(request.thread))
            if any(is_stop(i) for i in pending):
                return 0  # the /stop drops them
            items = [i for i in pending if i.kind in ("message", "report")]
            items = [i for i in items if i.kind != "message" or await self._admitted(request.thread, i, request.fence)]
            if not items:
                return 0
            ready = await self.readiness.ready(request.thread, items, request.session.id)
            await self.store.consume_messages(request.session.id, ready, fence=request.fence)
            return len(items)

        return drain

    async def _watch(self, thread: ThreadKey, running: _Running, watching: Stopper) -> None:
        """While a turn runs: answer status commands at once, cancel on /stop or /new, and
        cancel on any new message in `interrupt` mode."""
        state = self._state(str(thread))
        interrupt = self.config.inbox.busy_mode_for(thread.channel) == "interrupt"
        while not watching.stopped:
            state.wake.clear()
            for item in await self.store.inbox.pending(str(thread)):
                command = parse_command(item.payload.get("text", "")) if item.kind == "command" else None
                interrupting = command is not None and command.name in INTERRUPTING
                if command is not None and command.name in IMMEDIATE:
                    if await self._admitted(thread, item, None):
                        await self._reply_command(thread, item, command.name, running=True)
                elif interrupting and await self._refusal(thread, item, command.name):  # type: ignore[union-attr]
                    continue  # refused when its turn comes; the running turn goes on
                elif interrupting or (interrupt and item.kind == "message"):
                    running.turn.request_stop(command.name if command else "interrupt")
                    return
            # Local submits wake it at once; polling (for other instances' events) can be slow.
            try:
                await asyncio.wait_for(state.wake.wait(), max(self.config.inbox.poll_interval_s, WATCH_POLL_S))
            except TimeoutError:
                pass


def _waiting_notice(pending: Sequence[PromptRecord], *, question_is_theirs: bool) -> str:
    if any(p.kind == "approval" for p in pending):
        return WAITING_FOR_DECISION
    return PICK_A_BUTTON if question_is_theirs else NOT_YOUR_QUESTION


def _next_item(items: list[InboxItem]) -> InboxItem:
    """A /stop before anything queued ahead of it (which it drops unhandled); then resume items
    (a decided prompt continues its turn); then arrival order."""
    stop = next((i for i in items if is_stop(i)), None)
    if stop is not None:
        return stop
    resumes = [i for i in items if i.kind == "resume"]
    return resumes[0] if resumes else items[0]


async def _set_busy(channel, thread: ThreadKey, busy: bool, reply_to: str) -> None:  # noqa: ANN001
    if channel is None:
        return
    try:
        await channel.set_busy(thread, busy, reply_to)
    except Exception as exc:  # noqa: BLE001 - presence is cosmetic
        log.debug("set_busy on %s failed: %s", thread, exc)


class _LeaseHolder:
    """Renews a lease while work runs; reports when it was lost (another instance took over)."""

    def __init__(self, store: Store, lease: Lease, ttl_s: float):
        self.store = store
        self.lease = lease
        self.ttl_s = ttl_s
        self.valid = True
        self.stopper = Stopper()

    @property
    def fence(self) -> Fence:
        return Fence(self.lease.name, self.lease.owner, self.lease.fence)

    async def keep(self, *, on_lost: Callable[[], None]) -> None:
        while not await self.stopper.sleep(self.ttl_s / 3):
            try:
                renewed = await self.store.inbox.renew(self.lease, self.ttl_s)
            except Exception:  # noqa: BLE001 - a blip; the next renewal may succeed
                log.warning("could not renew %s", self.lease.name, exc_info=True)
                continue
            if renewed is None:
                self.valid = False
                on_lost()
                return
            self.lease = renewed
