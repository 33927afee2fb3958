"""Delivering what was recorded but never sent.

An outbox row stays `pending` when the process died between recording the intent and sending
it, or when its retries ran out. The sweeper finds rows pending for longer than
`outbox.sweep_after_s` on threads nobody is working on, takes the thread's lease (so no worker
and no other sweeper sends the same row meanwhile), and delivers them from what the row
recorded (a file send with its file), or gives up with the reason written on the row.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Literal

from gateway.approvals.prompts import IN_CHAT
from gateway.config import OutboxConfig
from gateway.delivery import fencing
from gateway.delivery.outbox import ORPHANED, Outbox
from gateway.events import (
    Button,
    Channel,
    ChannelError,
    Delivered,
    Outbound,
    OutboundFile,
    Prompt,
    ThreadKey,
    utcnow,
)
from gateway.inbox.holder import LeaseHolder
from gateway.store import Lease, LeaseLost, OutboxRecord, Store

log = logging.getLogger(__name__)
GAVE_UP = "given up by the sweeper after {age}: {error}"


@dataclass(frozen=True)
class SweepResult:
    delivered: int = 0
    given_up: int = 0


class OutboxSweeper:
    def __init__(self, store: Store, outbox: Outbox, config: OutboxConfig, *, instance_id: str, lease_ttl_s: float):
        self.store = store
        self.outbox = outbox
        self.config = config
        self.instance_id = instance_id
        # A lease name of its own: under the instance's name, taking a thread would extend the
        # lease of this instance's worker on it, and releasing it after the sweep would free the
        # thread under that worker's running turn for another instance to take.
        self.owner = f"{instance_id}/sweeper"
        self.lease_ttl_s = lease_ttl_s

    async def sweep(self, *, limit: int = 50) -> SweepResult:
        stuck = await self.store.outbox.stuck(timedelta(seconds=self.config.sweep_after_s), limit=limit)
        by_thread: dict[str, list[OutboxRecord]] = {}
        for row in stuck:
            by_thread.setdefault(row.thread_key, []).append(row)
        delivered = given_up = 0
        for thread_key, rows in by_thread.items():
            if await self._thread_busy(thread_key):
                continue  # its worker delivers what its turn recorded
            lease = await self.store.inbox.acquire(f"thread:{thread_key}", self.owner, self.lease_ttl_s)
            if lease is None:
                continue  # someone works on the thread right now
            swept = await self._sweep_thread(ThreadKey.parse(thread_key), rows, lease)
            delivered, given_up = delivered + swept.delivered, given_up + swept.given_up
        return SweepResult(delivered, given_up)

    async def _sweep_thread(self, thread: ThreadKey, rows: list[OutboxRecord], lease: Lease) -> SweepResult:
        """The thread's rows under its lease, kept while a send waits (a retry_after can be
        long) and proven before each send, like a worker's."""
        holder = LeaseHolder(self.store, lease, self.lease_ttl_s)
        renewing = asyncio.create_task(holder.keep(on_lost=lambda: None))
        fencing.hold(holder)
        delivered = given_up = 0
        try:
            for row in rows:
                if await self._sweep_row(thread, row):
                    delivered += 1
                else:
                    given_up += 1
        except LeaseLost as exc:
            log.warning("outbox sweep of %s stopped: %s", thread, exc)
        finally:
            fencing.hold(None)
            holder.stopper.stop()
            await asyncio.gather(renewing, return_exceptions=True)
            if holder.valid:
                await self.store.inbox.release(holder.lease)
        return SweepResult(delivered, given_up)

    async def _thread_busy(self, thread_key: str) -> bool:
        """A turn left running (it is continued and delivers its own reply, adopting a half
        streamed one) or items waiting: the thread's worker comes first."""
        if await self.store.inbox.count_pending(thread_key) > 0:
            return True
        return bool(await self.store.runs.list(stage="RUNNING", thread_key=thread_key, limit=1))

    async def _sweep_row(self, thread: ThreadKey, row: OutboxRecord) -> bool:
        return await deliver_left(self.store, self.outbox, self.config, thread, row)


async def deliver_left(
    store: Store, outbox: Outbox, config: OutboxConfig, thread: ThreadKey, row: OutboxRecord
) -> bool:
    """Deliver a row its sender left pending, under the thread's lease (the caller holds it):
    by the sweeper, or by a worker taking the thread over before its own replies. A row whose
    first send may have been cut mid-request is noted uncertain first; one too old, or whose
    file is gone, is given up with the reason. False when it is still not delivered."""
    current = await store.outbox.get(row.key)
    if current is None or current.status != "pending":
        return True
    age = utcnow() - row.created_at if row.created_at else timedelta(0)
    if age > timedelta(seconds=config.give_up_after_s):
        return await _give_up(store, row, GAVE_UP.format(age=_age(age), error=row.error or "never sent"))
    unsendable = _unsendable_file(row)
    if unsendable:
        return await _give_up(store, row, f"{unsendable}, so it was not sent")
    if _outcome_unknown(current, outbox.policy.max_attempts):
        await store.outbox.note_uncertain(current.key, current.thread_key, current.kind, ORPHANED, ())
        current = replace(current, uncertain=ORPHANED)  # a timeout of this resend is not sent a third time
    try:
        delivered = await outbox.deliver_recorded(current, thread, _action(row))
    except ChannelError as exc:
        if exc.permanent or (exc.ambiguous and current.uncertain is not None):
            return False  # with_retries marked the row failed, with the reason
        log.warning("outbox row %s (%s) still not delivered: %s", row.id, row.key, exc)
        return False
    if row.kind == "prompt" and row.key.startswith("prompt:"):
        # "prompt:<id>" is the prompt in its chat; "prompt:<id>:<rest>" a copy (gateway/approvals/prompts.py)
        prompt_id, _, rest = row.key.removeprefix("prompt:").partition(":")
        if not prompt_id.isdigit():
            pass  # a prompt row of another kind (a notice): nothing to note on a prompt record
        elif rest:
            receiver = rest.removeprefix(IN_CHAT) if rest.startswith(IN_CHAT) else ""
            await store.prompts.set_copy(int(prompt_id), row.thread_key, delivered.message_ids, receiver)
        else:
            await store.prompts.set_message_ids(int(prompt_id), list(delivered.message_ids))
    log.info("delivered outbox row %s (%s) that was left undelivered", row.id, row.key)
    return True


async def _give_up(store: Store, row: OutboxRecord, reason: str) -> bool:
    log.error("outbox row %s (%s): %s", row.id, row.key, reason)
    await store.outbox.attempt_failed(row.id, reason, final=True)
    return False


def _outcome_unknown(row: OutboxRecord, max_attempts: int) -> bool:
    """A new message whose sender may have been cut mid-request (killed while the platform
    carried the send out) without writing a word about it: nothing recorded after the intent,
    or failures recorded with attempts left (the sender meant to try again). A row whose
    attempts ran out was left for the sweeper with no attempt under way; edits are idempotent."""
    if row.kind not in ("message", "prompt") or row.uncertain is not None:
        return False
    return row.attempts < max_attempts


def _age(age: timedelta) -> str:
    hours = age.total_seconds() / 3600
    return f"{hours:.1f} h" if hours >= 1 else f"{age.total_seconds():.0f} s"


def _action(row: OutboxRecord) -> Callable[[Channel, tuple[str, ...]], Awaitable[Delivered]]:
    """How to send the row again from what it recorded."""
    payload = row.payload
    thread = ThreadKey.parse(row.thread_key)
    if row.kind == "prompt":
        prompt = prompt_from_payload(payload, thread)
        return lambda channel, _done: channel.send_prompt(prompt)
    if row.kind == "close_prompt":
        ids = [str(i) for i in payload.get("message_ids", [])]

        async def close(channel: Channel, _done: tuple[str, ...]) -> Delivered:
            await channel.close_prompt(thread, ids, str(payload.get("outcome", "")))
            return Delivered(tuple(ids))

        return close
    document = payload.get("document")
    file = payload.get("file")
    message = Outbound(
        thread,
        str(payload.get("text", "")),
        row.key,
        str(payload.get("reply_to") or ""),
        document=(str(document[0]), str(document[1])) if document else None,
        file=OutboundFile(**file) if file else None,
        links=tuple(str(link) for link in payload.get("links") or ()),
    )
    return lambda channel, done: channel.send(Outbound(**{**message.__dict__, "already": done}))


def _unsendable_file(row: OutboxRecord) -> str:
    """Why a send_file row's file cannot be sent now: gone (pruned or deleted since), or a link
    put in its place since it was checked (which could send another session's file)."""
    file = row.payload.get("file") if row.kind == "message" else None
    if not file:
        return ""
    path = Path(str(file.get("path", "")))
    if os.path.realpath(path) != str(path):
        return f"the file {path} was replaced by a link"
    if not path.is_file():
        return f"the file {path} no longer exists"
    return ""


def _tone(value: object) -> Literal["", "positive", "negative"]:
    return value if value in ("positive", "negative") else ""


def prompt_from_payload(payload: dict, thread: ThreadKey) -> Prompt:
    buttons = tuple(
        tuple(Button(str(b["label"]), str(b["token"]), str(b.get("url") or ""), tone=_tone(b.get("tone"))) for b in row)
        for row in payload.get("buttons", [])
    )
    return Prompt(
        payload["kind"],
        thread,
        payload["key"],
        payload.get("text", ""),
        buttons,
        tool_name=payload.get("tool_name", ""),
        arguments=payload.get("arguments", ""),
        hint=payload.get("hint", ""),
        receiver=payload.get("receiver", ""),
    )
