"""One turn driven as the inbox drives it (the message consumed, the run started, `Turn.run`),
on a gateway that is built but not started: nothing else runs beside it, so the statements the
store sent are the turn's alone. Used by the statement-count tests and bench/growth.py."""

from __future__ import annotations

import time

from gateway.agent.messages import TurnOutcome, TurnRequest
from gateway.agent.turn import Turn
from gateway.app import Gateway
from gateway.events import ThreadKey
from gateway.store import NewItem


async def drive_turn(gateway: Gateway, thread: ThreadKey, text: str, *, person: str = "1") -> TurnOutcome:
    """A turn of `person` in `thread` (a direct message); raises unless it ends with a reply."""
    store = gateway.store
    session = await store.sessions.current(str(thread)) or await store.sessions.open(
        str(thread), source=thread.channel, started_by=person, private=True
    )
    event_id = f"drive:{time.monotonic_ns()}:{thread}"
    await store.inbox.add([NewItem(event_id, str(thread), "message", {"text": text, "sender": {"id": person}})])
    item = await store.inbox.get_by_event(event_id)
    assert item is not None
    started = await store.start_turn(session.id, str(thread), [(item.id, item.payload)], model=gateway.config.llm.model)
    request = TurnRequest(
        session, thread, requested_by=person, private=True,  # a direct message
        turn_started_seq=started.rows[0].seq, started_run=started.run,
    )
    outcome = await Turn(gateway.services, request).run()
    if outcome.stage != "SUCCESS":
        raise RuntimeError(f"turn ended {outcome.stage}/{outcome.end_reason}: {outcome.error}")
    return outcome


async def statements_per_turn(gateway: Gateway, thread: ThreadKey, turns: int, *, warm: int = 2) -> float:
    """The statements the store sent per turn, over `turns` turns after `warm` ones."""
    for n in range(warm):
        await drive_turn(gateway, thread, f"Warming up {n}")
    before = gateway.store.db.count.statements
    for n in range(turns):
        await drive_turn(gateway, thread, f"Question {n}: how is it going?")
    return (gateway.store.db.count.statements - before) / turns
