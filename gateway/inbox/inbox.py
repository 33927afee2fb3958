"""The durable per-thread inbox: intake, the dispatcher, continuing runs left by a stopped worker.

`submit` commits events before it returns (channels confirm to the platform only after).
A dispatcher finds threads with pending items and takes each thread's lease (a database row
with a fencing token), so exactly one worker on one instance processes a thread, in arrival
order, while different threads run concurrently under `inbox.max_concurrent_turns`.
One thread's worker is in worker.py, its running turn in running.py.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import replace

from gateway.agent.services import TurnServices
from gateway.agent.turn import Turn
from gateway.approvals.prompts import UNKNOWN_BUTTON
from gateway.events import ButtonPress, InboundEvent, InboundMessage, SubmitResult, ThreadKey
from gateway.files.session_files import SessionFiles
from gateway.inbox.commands import parse_command
from gateway.inbox.revisions import Revisions, revises
from gateway.inbox.running import TurnListener, apply_poll
from gateway.inbox.sweeper import OutboxSweeper
from gateway.inbox.worker import Worker
from gateway.running.lifecycle import Stopper
from gateway.serving import metrics
from gateway.store import NewItem, Store, notify
from gateway.store.items import ContinueRun, message_item

log = logging.getLogger(__name__)
MAINTENANCE_EVERY_S = 5.0


def default_instance_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def event_item(event: InboundMessage) -> NewItem:
    return message_item(event, "command" if parse_command(event.text) else "message")


class Inbox:
    def __init__(
        self,
        store: Store,
        services: TurnServices,
        *,
        instance_id: str | None = None,
        listeners: Sequence[TurnListener] = (),
    ):
        self.store = store
        self.services = services
        self.config = services.config
        self.instance_id = instance_id or self.config.serve.instance_id or default_instance_id()
        self.listeners: list[TurnListener] = list(listeners)
        self._workers: dict[str, asyncio.Task] = {}
        self._wake = asyncio.Event()
        self._dispatcher: asyncio.Task | None = None
        self._polled_at = float("-inf")  # when the dispatcher last looked at the running threads' news
        self._stopper = Stopper()
        slots = asyncio.Semaphore(self.config.inbox.max_concurrent_turns)
        services.turn_slots = slots  # sub-agents take them too (gateway/agent/delegation.py)
        self.worker = Worker(store, services, listeners=self.listeners, stopper=self._stopper, slots=slots)
        self._turns = self.worker.runner
        self.revisions = Revisions(store)
        self.session_files = SessionFiles(store, self.config)
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
        messages: list[InboundMessage] = []
        for event in events:
            if revises(event):  # an edit, a deletion, a reaction, kept chatter: applied as recorded,
                await self._add_messages(messages, None, results)  # after the messages before it
                messages = []
                results[event.event_id] = await self.revisions.submit(event)  # type: ignore[arg-type]
            elif isinstance(event, ButtonPress):
                results[event.event_id] = await self._press(event)
                if results[event.event_id].duplicate:
                    metrics.DUPLICATES.labels(event.thread.channel).inc()
                else:
                    metrics.INBOUND.labels(event.thread.channel, "button").inc()
            elif isinstance(event, InboundMessage):
                messages.append(event)
        await self._add_messages(messages, cursor, results)
        for event in events:
            if event.thread.chat:  # a tap without its chat woke its prompt's thread itself
                self._poke(str(event.thread))
        presses = {str(e.thread) for e in events if isinstance(e, ButtonPress) and e.thread.chat}
        await notify.publish(self.store.db, presses)  # a decided prompt's resume item (messages: in `add`)
        return [results[e.event_id] for e in events]

    async def _add_messages(
        self, messages: list[InboundMessage], cursor: tuple[str, str] | None, results: dict[str, SubmitResult]
    ) -> None:
        if not messages and cursor is None:
            return
        created = await self.store.inbox.add([event_item(e) for e in messages], cursor=cursor)
        for event, new in zip(messages, created, strict=False):
            results[event.event_id] = SubmitResult(event.event_id, duplicate=not new)
            if new:
                kind = "command" if parse_command(event.text) else "message"
                metrics.INBOUND.labels(event.thread.channel, kind).inc()
            else:
                metrics.DUPLICATES.labels(event.thread.channel).inc()

    def poke(self, thread_key: str) -> None:
        """Something was queued for this thread: look at once (not at the next poll)."""
        self._poke(thread_key)

    async def _press(self, press: ButtonPress) -> SubmitResult:
        if await self.store.inbox.get_by_event(press.event_id) is not None:
            return SubmitResult(press.event_id, duplicate=True)  # a redelivered tap (prompt or pairing)
        gatekeeper = self.services.gatekeeper
        pairing = gatekeeper is not None and gatekeeper.handles(press)  # its token says which request
        if not press.thread.chat and not pairing:  # the platform named the button's message, not its chat
            return await self._press_without_chat(press)
        if gatekeeper is None or not pairing:
            result = await self.services.prompts.press(press)
            asked_in = await self.services.prompts.thread_of(press.token) if not result.alert else None
            if asked_in is not None and asked_in != str(press.thread):  # a copy in a decider's DM
                self._poke(asked_in)
                await notify.publish(self.store.db, {asked_in})
            return result
        result, woken = await gatekeeper.press(press)
        if woken is not None:
            self._poke(woken)  # its held messages are queued again
        return result

    async def _press_without_chat(self, press: ButtonPress) -> SubmitResult:
        """A tap that came without its chat (Telegram's `inline_message_id`): the thread is the
        one its prompt was asked in, found by the token; an unknown token is answered as such."""
        asked_in = await self.services.prompts.thread_of(press.token)
        if asked_in is None or ThreadKey.channel_of(asked_in) != press.thread.channel:
            return SubmitResult(press.event_id, answer=UNKNOWN_BUTTON, alert=True)
        result = await self.services.prompts.press(replace(press, thread=ThreadKey.parse(asked_in)))
        if not result.alert:
            self._poke(asked_in)
            await notify.publish(self.store.db, {asked_in})
        return result

    def _poke(self, thread_key: str) -> None:
        state = self._turns.threads.get(thread_key)
        if state is not None:  # a worker is on it (one that has not started yet reads first anyway)
            state.poke()
        if thread_key not in self._workers:  # else its worker reads it next, or wakes us when it ends
            self._wake.set()

    def running_turn(self, session_id: int) -> Turn | None:
        """The turn this instance is running for a session, if any."""
        return self._turns.running_turn(session_id)

    # ---- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        await self.continue_stopped_runs()
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
        for turn in self._turns.running_turns():
            turn.request_stop("shutdown")  # suspended; continued after the restart
        if workers:
            _, stuck = await asyncio.wait(workers, timeout=10)
            for task in stuck:  # last resort: a worker that ignores the stop
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        await self.store.inbox.release_all(self.instance_id)

    async def continue_stopped_runs(self) -> int:
        """Runs left RUNNING by a dead worker are continued: a continue item per run whose
        thread lease is free (a live instance's runs are left alone)."""
        count = 0
        running = await self.store.runs.list(stage="RUNNING", limit=1000)
        inline = await self.store.delegations.sync_child_sessions([r.session_id for r in running])
        # A child inside its parent's turn is continued by the parent's turn; our own workers'
        # threads are live; of the others, one read finds the leases still held.
        orphans = [
            (f"thread:{r.thread_key}", r)
            for r in running
            if r.session_id not in inline and r.thread_key not in self._workers
        ]
        held = await self.store.inbox.held_leases([name for name, _ in orphans])
        for name, run in orphans:
            if name in held:
                continue
            if await self.store.inbox.add_continuation(ContinueRun(run.id).item(run.thread_key), run.id):
                count += 1
                self._poke(run.thread_key)
        return count

    async def wait_until_idle(self, timeout: float = 30.0) -> None:
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
        await self.services.prompts.expire_due()
        if self.services.gatekeeper is not None:
            await self.services.gatekeeper.expire_due()
        if self.services.spend is not None:
            await self.services.spend.sweep()
        await self.continue_stopped_runs()
        await self.session_files.prune_due()
        if self._sweeping is None or self._sweeping.done():  # off the dispatcher: a send may wait
            self._sweeping = asyncio.create_task(self._sweep(), name="outbox-sweeper")

    async def _sweep(self) -> None:
        try:
            await self.sweeper.sweep()
        except Exception:  # noqa: BLE001 - the next round of maintenance tries again
            log.exception("outbox sweep failed")

    async def _dispatch_once(self) -> None:
        # One read serves both: threads to start, and the running ones' news from other
        # instances (so a running turn need not poll the inbox itself; see apply_poll). Local
        # news pokes its thread at once, so the running ones are looked at once a poll interval,
        # not on every wake-up (a thousand turns ending are a thousand wake-ups).
        mine = list(self._workers)
        read_at = time.monotonic()
        polling = read_at - self._polled_at >= self.config.inbox.poll_interval_s
        threads = self._turns.threads
        pokes = {key: threads[key].pokes for key in mine if key in threads} if polling else {}
        free = self.config.inbox.max_concurrent_turns - len(mine)
        limit = max(free, 1) * 2 + len(mine)
        pending = await self.store.inbox.pending_threads(limit=limit)
        if polling:
            apply_poll(threads, pokes, read_at, pending, complete=len(pending) < limit)
            self._polled_at = read_at
        others = [thread_key for thread_key in pending if thread_key not in self._workers]
        if free <= 0:
            # Saturated: tell busy workers whether other threads wait, so they hand over their
            # slot after the current turn instead of draining their own queue first.
            self.worker.others_waiting = bool(others)
            return
        self.worker.others_waiting = False
        for thread_key in others:
            if len(self._workers) >= self.config.inbox.max_concurrent_turns:
                break
            lease = await self.store.inbox.acquire(
                f"thread:{thread_key}", self.instance_id, self.config.inbox.lease_ttl_s
            )
            if lease is None:
                continue  # another instance holds it
            if lease.taken_over:
                metrics.LEASE_TAKEOVERS.labels("thread").inc()
            task = asyncio.create_task(self.worker.work_thread(thread_key, lease), name=f"thread {thread_key}")
            self._workers[thread_key] = task
            task.add_done_callback(functools.partial(self._worker_done, thread_key))

    def _worker_done(self, thread_key: str, _task: asyncio.Task[None]) -> None:
        self._workers.pop(thread_key, None)
        self._wake.set()
