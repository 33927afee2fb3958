"""`gateway chat` after a restart: the prompts its conversation waits on, shown again.

A turn parked on an approval or a question keeps waiting in the database when `gateway chat`
ends, but its buttons were in the old process's terminal. At the start each prompt still
pending in the terminal's thread is shown again from the outbox row that recorded it, with its
numbers, and becomes that message (so its decision closes it here). A row a killed process
never marked sent is marked now: the terminal shows it, the outbox sweeper need not.
"""

from __future__ import annotations

from gateway.events import Channel, Outbound, ThreadKey, utcnow
from gateway.inbox.sweeper import prompt_from_payload
from gateway.store import Store

STILL_WAITING = "⏳ Still waiting for your answer (asked before the restart):"


async def show_waiting_prompts(store: Store, channel: Channel, thread: ThreadKey) -> int:
    """Show the thread's pending prompts again; how many were shown."""
    shown = 0
    now = utcnow()
    for prompt in await store.prompts.pending(thread_key=str(thread)):
        if prompt.expires_at is not None and prompt.expires_at <= now:
            continue  # expired: the expiry sweep closes it and tells the turn
        row = await store.outbox.get(f"prompt:{prompt.id}")
        if row is None or row.kind != "prompt":
            continue
        await channel.send(Outbound(thread, STILL_WAITING, key=f"shown-again:{prompt.id}"))
        delivered = await channel.send_prompt(prompt_from_payload(row.payload, thread))
        await store.prompts.set_message_ids(prompt.id, list(delivered.message_ids))
        if row.status == "pending":
            await store.outbox.mark_sent(row.id, delivered.message_ids)
        shown += 1
    return shown


__all__ = ["STILL_WAITING", "show_waiting_prompts"]
