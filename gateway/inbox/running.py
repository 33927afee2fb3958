"""A turn running on its thread: the busy sign, steering (messages that arrive join the turn
at a round boundary), the watch that answers status commands and cancels on /stop, /new or
(in `interrupt` mode) any message, and what follows the turn's end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gateway.agent.messages import TurnOutcome, TurnRequest
from gateway.agent.services import TurnServices
from gateway.agent.turn import Turn
from gateway.events import ThreadKey, TurnEnded
from gateway.inbox.attached import MessageReadiness
from gateway.inbox.commands import IMMEDIATE, INTERRUPTING, Commands, is_stop, parse_command
from gateway.running.lifecycle import Stopper
from gateway.store import Fence, InboxItem, Store
from gateway.store.items import ContinueRun, Said

log = logging.getLogger("gateway.inbox.inbox")
TurnListener = Callable[[TurnEnded], Awaitable[None]]
Admitted = Callable[[ThreadKey, InboxItem, Fence | None], Awaitable[bool]]
WATCH_POLL_S = 1.0


@dataclass
class Running:
    task: asyncio.Task
    turn: Turn


@dataclass
class ThreadState:
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    running: Running | None = None
    pokes: int = 0  # work queued here so far, as this instance was told (its submits, notifications)
    # (pokes, when) of a read that found nothing pending beyond what was being handled
    quiet: tuple[int, float] | None = None

    def poke(self) -> None:
        self.pokes += 1
        self.wake.set()

    def found(self, pokes_before: int, others_pending: bool) -> None:
        """A pending read that started at `pokes_before` found `others_pending`, or not."""
        self.quiet = None if others_pending else (pokes_before, time.monotonic())

    def confirmed_quiet(self, pokes_before: int, read_at: float) -> None:
        """A read of pending work that started at `read_at` (monotonic) with `pokes_before` found
        nothing for this thread: a quiet state that is still current is quiet as of then."""
        if self.quiet is not None and self.quiet[0] == pokes_before == self.pokes:
            self.quiet = (pokes_before, max(self.quiet[1], read_at))

    def known_quiet(self, within_s: float) -> bool:
        """Nothing can be pending that a read would find: none was at the last read, nothing
        was queued since, and it is recent enough that another instance's work (which polling
        finds) need not be looked for yet."""
        return (
            self.quiet is not None
            and self.quiet[0] == self.pokes
            and time.monotonic() - self.quiet[1] < within_s
        )


def apply_poll(
    threads: dict[str, ThreadState], pokes_before: dict[str, int], read_at: float, pending: list[str], *, complete: bool
) -> None:
    """The dispatcher's read of the threads with pending work (started at `read_at` with
    `pokes_before`) covers the threads this instance is working on: one that has work it was
    not told of (another instance's) is looked at now; a quiet one stays known quiet without a
    read of its own. Only a `complete` read (not cut by its limit) can confirm quiet."""
    found = set(pending)
    for thread_key, before in pokes_before.items():
        state = threads.get(thread_key)
        if state is None:
            continue
        if thread_key in found:
            if state.quiet is not None:
                state.poke()
        elif complete:
            state.confirmed_quiet(before, read_at)


class TurnEnds:
    """What follows a turn's end: a suspended one is continued later, a background child's
    result goes to its parent, any other is told to the listeners (the scheduler's reports)."""

    def __init__(self, store: Store, services: TurnServices, listeners: list[TurnListener]):
        self.store = store
        self.services = services
        self.listeners = listeners  # the inbox's list: listeners added after start are told too

    async def report(self, request: TurnRequest, result: TurnOutcome) -> None:
        if result.stage == "SUSPENDED":
            await self.store.inbox.add([ContinueRun(result.run_id).item(str(request.thread))])
            return
        if result.stage == "LOST":
            return
        if request.child is not None and self.services.delegation is not None:  # back to its parent
            await self.services.delegation.control.background_ended(request, result)
            return
        if self.services.voice is not None:
            try:
                await self.services.voice.after_turn(request, result)
            except Exception:  # noqa: BLE001 - the answer is out; its voice note is extra
                log.exception("voice note for %s failed", request.thread)
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


class TurnRunner:
    def __init__(
        self,
        store: Store,
        services: TurnServices,
        readiness: MessageReadiness,
        ends: TurnEnds,
        commands: Commands,
        *,
        admitted: Admitted,
        stopper: Stopper,
    ):
        self.store = store
        self.services = services
        self.config = services.config
        self.readiness = readiness
        self.ends = ends
        self.commands = commands
        self.admitted = admitted
        self.stopper = stopper
        self.threads: dict[str, ThreadState] = {}

    def state(self, thread_key: str) -> ThreadState:
        return self.threads.setdefault(thread_key, ThreadState())

    def forget(self, thread_key: str) -> None:
        """The thread's worker has ended: its state goes with it (a next worker starts with
        none, so it reads before it trusts anything), and the states stay as many as workers."""
        state = self.threads.get(thread_key)
        if state is not None and state.running is None:
            del self.threads[thread_key]

    def running_turn(self, session_id: int) -> Turn | None:
        for state in self.threads.values():
            if state.running is not None and state.running.turn.session.id == session_id:
                return state.running.turn
        return None

    def running_turns(self) -> list[Turn]:
        return [s.running.turn for s in self.threads.values() if s.running is not None]

    def lost(self, thread_key: str) -> None:
        """The thread's lease went to another instance: the turn stops at once."""
        state = self.threads.get(thread_key)
        running = state.running if state is not None else None
        if running is not None:
            running.turn.request_stop("lease lost")

    async def run(self, request: TurnRequest) -> None:
        thread_key = str(request.thread)
        state = self.state(thread_key)
        turn = Turn(self.services, request, drain=self._steering(request), stopping=lambda: self.stopper.stopped)
        channel = self.services.outbox.channels.get(request.thread.channel)
        await _set_busy(channel, request.thread, True, request.reply_to)
        task = asyncio.create_task(turn.run(), name=f"turn {thread_key}")
        state.running = Running(task, turn)
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
        await self.ends.report(request, result)

    def _steering(self, request: TurnRequest) -> Callable[[], Awaitable[int]] | None:
        if self.config.inbox.busy_mode_for(request.thread.channel) != "steer" or request.child is not None:
            return None

        state = self.state(str(request.thread))

        async def steer() -> int:
            """Steer: messages that arrived during the turn join it at the round boundary."""
            if state.known_quiet(self._quiet_window()):
                return 0
            before = state.pokes
            pending = await self.store.inbox.pending(str(request.thread))
            state.found(before, bool(pending))
            if any(is_stop(i) for i in pending):
                return 0  # the /stop drops them
            # An edit of a message already answered joins too, as "(edited) ..." (surroundings.py).
            # Only the requester's own words join: another person's message waits and runs as
            # their own turn, with their rights (gateway/agent/voices.py).
            items = [
                i for i in pending if i.kind == "report" or (i.kind in ("message", "edit") and _said_by(i, request))
            ]
            items = [i for i in items if i.kind == "report" or await self.admitted(request.thread, i, request.fence)]
            if not items:
                return 0
            ready = await self.readiness.ready(request.thread, items, request.session.id)
            request.hears([payload for _, payload in ready])
            running = state.running
            run_id = running.turn.run_id if running is not None and running.turn.run_id else None
            await self.store.consume_messages(request.session.id, ready, fence=request.fence, run_id=run_id)
            return len(items)

        return steer

    async def _watch(self, thread: ThreadKey, running: Running, watching: Stopper) -> None:
        """While a turn runs: answer status commands at once, cancel on /stop or /new, and
        cancel on any new message in `interrupt` mode."""
        state = self.state(str(thread))
        interrupt = self.config.inbox.busy_mode_for(thread.channel) == "interrupt"
        while not watching.stopped:
            state.wake.clear()
            for item in await self._pending(state, str(thread)):
                command = parse_command(item.payload.get("text", "")) if item.kind == "command" else None
                interrupting = command is not None and command.name in INTERRUPTING
                if command is not None and command.name in IMMEDIATE:
                    if await self.admitted(thread, item, None):
                        await self.commands.answer(thread, item, command.name, running=True)
                elif (
                    interrupting or (interrupt and item.kind == "message" and not self._answers(str(thread)))
                ) and await self._stops(thread, item, running, command.name if command else ""):
                    if not self._stream_stopped(thread, item):  # a Stop on a reply already sent: not this turn's
                        log.debug("%s: a Stop pressed on a reply already sent; ignored", thread)
                        await self.store.inbox.finish([item.id])
                        continue
                    running.turn.request_stop(command.name if command else "interrupt")
                    return
            # Local submits wake it at once; polling (for other instances' events) can be slow.
            try:
                await asyncio.wait_for(state.wake.wait(), max(self.config.inbox.poll_interval_s, WATCH_POLL_S))
            except TimeoutError:
                pass


    def _stream_stopped(self, thread: ThreadKey, item: InboxItem) -> bool:
        """A Stop pressed on a reply stream, told to the channel of this instance, which runs the
        turn (the press may have been read by another): it keeps the text so far when it is set
        to. False when that stream's reply was already sent here (the press came too late)."""
        stream = item.payload.get("stops_stream")
        told = getattr(self.services.outbox.channels.get(thread.channel), "stream_stopped", None)
        return not stream or told is None or bool(told(thread, str(stream)))

    async def _stops(self, thread: ThreadKey, item: InboxItem, running: Running, command: str) -> bool:
        """Whether a /stop, a /new or (interrupt mode) a message stops the running turn: never
        a stranger's (held or dropped like any message of theirs), nor a /stop of someone else's
        turn by a member (answered at once), nor a refused /new (refused when its turn comes),
        nor another person's message (it runs as their own turn after this one)."""
        if not await self.admitted(thread, item, None):
            return False
        if command == "stop":
            refusal = await self.commands.refusal(thread, item, "stop", running_for=running.turn.req.requested_by)
            if refusal:
                await self.commands.refuse_now(thread, item, refusal)
            return not refusal
        if not command:  # `interrupt` mode: only the person whose turn runs cancels it by writing;
            return _said_by(item, running.turn.req)  # anyone else's message waits for its own turn
        return not await self.commands.refusal(thread, item, command)

    def _answers(self, thread_key: str) -> bool:
        """A call of the turn waits for an answer typed in the thread: a message is read by it
        (gateway/mcp/midcall.py), not an interruption."""
        return bool(self.services.prompts.waiting_in_call.get(thread_key))

    def _quiet_window(self) -> float:
        # The dispatcher confirms quiet threads at every poll (`polled`): two polls' time
        # without a confirmation means it is busy or gone, and the thread reads for itself.
        return 2 * self.config.inbox.poll_interval_s

    async def _pending(self, state: ThreadState, thread_key: str) -> list[InboxItem]:
        if state.known_quiet(self._quiet_window()):
            return []  # the read that found nothing is recent, and nothing was queued since
        before = state.pokes
        items = await self.store.inbox.pending(thread_key)
        state.found(before, bool(items))
        return items


def _said_by(item: InboxItem, request: TurnRequest) -> bool:
    sender = Said.of(item).sender.id
    return bool(sender) and sender == str(request.requested_by)


async def _set_busy(channel, thread: ThreadKey, busy: bool, reply_to: str) -> None:  # noqa: ANN001
    if channel is None:
        return
    try:
        await channel.set_busy(thread, busy, reply_to)
    except Exception as exc:  # noqa: BLE001 - presence is cosmetic
        log.debug("set_busy on %s failed: %s", thread, exc)
