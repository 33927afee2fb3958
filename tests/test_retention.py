"""Retention: finished work older than its retention is pruned in batches; pending, held and
parked work never is."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from harness import make_config, running_gateway
from sqlalchemy import update

from gateway.events import utcnow
from gateway.store import AuditEntry, NewItem, RetentionDays
from gateway.store.tables import audit, inbox, outbox, prompts, run_events

OLD = utcnow() - timedelta(days=45)
THREAD = "fake:chat1:"


async def age(store, table, **where) -> None:  # noqa: ANN001
    column = {"inbox": "done_at", "run_events": "at"}.get(table.name, "created_at")
    condition = [table.c[k] == v for k, v in where.items()]
    await store.db.write(lambda conn: conn.execute(update(table).where(*condition).values({column: OLD})))


async def seed(store):  # noqa: ANN001, ANN201
    session = await store.sessions.open(THREAD, source="fake")
    items = [NewItem(f"e{n}", THREAD, "message", {"text": f"m{n}"}) for n in range(5)]
    await store.inbox.add(items)
    pending = await store.inbox.pending(THREAD)
    await store.inbox.finish([i.id for i in pending[:3]])  # three done, one held, one pending
    finished = await store.runs.start(session.id, THREAD)
    await store.runs.add_event(finished.id, "LLM_REQUEST", {})
    await store.runs.set_stage(finished.id, "SUCCESS", end_reason="reply")
    parked = await store.runs.start(session.id, THREAD)
    await store.runs.add_event(parked.id, "LLM_REQUEST", {})
    await store.runs.set_stage(parked.id, "AWAITING_INPUT")
    await age(store, run_events)
    for key in ("sent", "stuck"):
        await store.outbox.record(key, THREAD, "message", {"text": key})
    await store.outbox.mark_sent((await store.outbox.get("sent")).id, ["1"])
    await age(store, outbox)
    decided, _ = await store.prompts.create(
        kind="approval", session_id=session.id, thread_key=THREAD, payload={}, requested_by="", expires_at=None
    )
    await store.prompts.cancel([decided.id])
    waiting, _ = await store.prompts.create(
        kind="approval", session_id=session.id, thread_key=THREAD, payload={}, requested_by="", expires_at=None
    )
    await age(store, prompts)
    assert await store.inbox.hold_while_waiting(pending[3].id, [waiting.id])  # after the other was canceled
    for status in ("done", "held", "pending"):
        await age(store, inbox, status=status)
    await store.audit.record(*(AuditEntry(kind="tool_call", action=a, tool="shell") for a in ("old", "older", "new")))
    for action, days in (("old", 45), ("older", 100)):  # the audit trail is kept 90 days by default
        aged = update(audit).where(audit.c.action == action).values(at=utcnow() - timedelta(days=days))
        await store.db.write(lambda conn, aged=aged: conn.execute(aged))
    return finished, parked, waiting


async def test_old_finished_work_is_pruned_and_pending_or_parked_work_is_kept(store):
    finished, parked, waiting = await seed(store)

    pruned = await store.retention.prune(RetentionDays(), batch=2)  # batches smaller than the work

    assert pruned == {"inbox": 3, "outbox": 1, "prompts": 1, "run_events": 1, "audit": 1}
    assert [r.action for r in await store.audit.list_audit()] == ["new", "old"]
    assert {i.payload["text"] for i in await store.inbox.pending(THREAD)} == {"m4"}
    assert (await store.inbox.get_by_event("e3")).status == "held"
    assert await store.outbox.get("sent") is None and (await store.outbox.get("stuck")).status == "pending"
    assert (await store.prompts.get(waiting.id)).status == "pending"
    assert await store.runs.events(finished.id) == [] and len(await store.runs.events(parked.id)) == 1
    assert await store.runs.get(finished.id) is not None  # the run record itself stays


async def test_recent_work_and_zero_days_are_kept(store):
    await seed(store)
    pruned = await store.retention.prune(RetentionDays(inbox=0, outbox=60, prompts=60, run_events=60, audit=0))
    assert pruned == {"outbox": 0, "prompts": 0, "run_events": 0}
    assert len(await store.audit.list_audit()) == 3
    assert await store.inbox.get_by_event("e0") is not None


async def test_the_leader_prunes(store, llm, tmp_path):
    await seed(store)
    config = make_config(llm.base_url, str(tmp_path), retention={"every_s": 0.1, "audit_days": 30})
    async with running_gateway(store, config):
        for _ in range(100):
            if await store.outbox.get("sent") is None and len(await store.audit.list_audit()) == 1:
                break
            await asyncio.sleep(0.05)
    assert await store.outbox.get("sent") is None and await store.inbox.get_by_event("e0") is None
    assert [r.action for r in await store.audit.list_audit()] == ["new"]  # audit_days from the config
