import asyncio
from datetime import timedelta

import pytest

from gateway.events import utcnow
from gateway.store import Fence, LeaseLost, NewItem, NewToolCall


async def test_concurrent_appends_get_distinct_increasing_sequence_numbers(store):
    session = await store.sessions.open("console:local:", source="console")

    async def append(i: int):
        return await store.sessions.append(session.id, "user", f"message {i}")

    records = await asyncio.gather(*(append(i) for i in range(200)))
    seqs = sorted(r.seq for r in records)
    assert seqs == list(range(1, 201))
    history = await store.sessions.history(session.id)
    assert [m.seq for m in history] == list(range(1, 201))


async def test_history_attaches_tool_calls_in_declared_order(store):
    session = await store.sessions.open("console:local:", source="console")
    await store.sessions.append(session.id, "user", "hi")
    msg = await store.sessions.append(
        session.id,
        "assistant",
        "",
        calls=[NewToolCall("b", "clock", "{}"), NewToolCall("a", "list_dir", '{"path": "."}')],
    )
    await store.sessions.set_tool_call(msg.tool_calls[1].id, status="done", result="files")
    history = await store.sessions.history(session.id)
    assert [c.call_id for c in history[1].tool_calls] == ["b", "a"]
    assert history[1].tool_calls[1].result == "files"
    assert history[1].tool_calls[0].status == "running"


async def test_open_with_fresh_starts_a_new_session(store):
    first = await store.sessions.open("slack:C1:1.0", source="slack")
    again = await store.sessions.open("slack:C1:1.0", source="slack")
    fresh = await store.sessions.open("slack:C1:1.0", source="slack", fresh=True)
    assert first.id == again.id
    assert fresh.id != first.id
    assert (await store.sessions.current("slack:C1:1.0")).id == fresh.id
    assert (await store.sessions.get(first.id)).closed_at is not None


async def test_inbox_ignores_duplicate_event_ids_and_commits_cursor(store):
    item = NewItem("tg:1:10", "telegram:5:", "message", {"text": "hi"})
    assert await store.inbox.add([item], cursor=("telegram:offset", "11")) == [True]
    assert await store.inbox.add([item], cursor=("telegram:offset", "11")) == [False]
    assert await store.inbox.load_cursor("telegram:offset") == "11"
    assert len(await store.inbox.pending("telegram:5:")) == 1


async def test_lease_takeover_bumps_fence_and_old_holder_cannot_write(store, clock):
    session = await store.sessions.open("console:x:", source="console")
    first = await store.inbox.acquire("thread:console:x:", "a", ttl_s=30, now=clock.now())
    assert first is not None
    clock.advance(29)
    assert await store.inbox.acquire("thread:console:x:", "b", ttl_s=10, now=clock.now()) is None
    clock.advance(1)
    second = await store.inbox.acquire("thread:console:x:", "b", ttl_s=10, now=clock.now())
    assert second is not None and second.fence == first.fence + 1
    with pytest.raises(LeaseLost):
        await store.sessions.append(session.id, "user", "late", fence=Fence(first.name, first.owner, first.fence))
    await store.sessions.append(session.id, "user", "ok", fence=Fence(second.name, second.owner, second.fence))
    assert await store.inbox.renew(first, 10) is None


async def test_held_leases_names_those_owned_and_unexpired_in_one_read(store):
    held = await store.inbox.acquire("thread:a", "me", ttl_s=30)
    await store.inbox.acquire("thread:expired", "me", ttl_s=30, now=utcnow() - timedelta(hours=1))
    released = await store.inbox.acquire("thread:released", "me", ttl_s=30)
    await store.inbox.release(released)
    names = ["thread:a", "thread:expired", "thread:released", "thread:never"]
    assert held is not None and await store.inbox.held_leases(names) == {"thread:a"}
    assert await store.inbox.held_leases([]) == set()


async def test_a_takeover_committing_during_a_fenced_write_makes_that_write_fail(store, db_kind):
    """The interleaving the fence exists for, made deterministic on PostgreSQL: a takeover
    holds the lease row (updated, not committed) while the old holder's fenced write starts;
    the write must wait for it and then fail, not pass on the row's last committed state."""
    if db_kind != "postgres":
        pytest.skip("SQLite serialises writers (BEGIN IMMEDIATE): the interleaving cannot happen")
    import asyncpg
    from conftest import dsn_of

    session = await store.sessions.open("console:x:", source="console")
    held = await store.inbox.acquire("thread:console:x:", "a", ttl_s=30)
    settings = {"search_path": store.db.pg_schema} if store.db.pg_schema else {}
    takeover = await asyncpg.connect(dsn_of(store), server_settings=settings)
    try:
        transaction = takeover.transaction()
        await transaction.start()
        await takeover.execute("UPDATE leases SET owner = 'b', fence = fence + 1 WHERE name = 'thread:console:x:'")
        write = asyncio.create_task(
            store.sessions.append(session.id, "user", "late", fence=Fence(held.name, held.owner, held.fence))
        )
        await asyncio.sleep(0.5)
        assert not write.done()  # it waits for the lease row instead of reading past the takeover
        await transaction.commit()
        with pytest.raises(LeaseLost):
            await asyncio.wait_for(write, 10)
    finally:
        await takeover.close()
    assert [m.content for m in await store.sessions.history(session.id)] == []


async def test_counters_and_run_event_sequences(store):
    assert await store.inbox.bump_counter("refused:1") == 1
    assert await store.inbox.bump_counter("refused:1") == 2
    session = await store.sessions.open("console:y:", source="console")
    run = await store.runs.start(session.id, "console:y:")
    seqs = await asyncio.gather(*(store.runs.add_event(run.id, "LLM_REQUEST", {"i": i}) for i in range(30)))
    assert sorted(seqs) == list(range(1, 31))


async def test_a_write_waits_for_another_process_lock_without_blocking_the_event_loop(sqlite_store):
    import sqlite3

    from sqlalchemy import make_url

    session = await sqlite_store.sessions.open("test:locked", source="test")
    other = sqlite3.connect(make_url(sqlite_store.db.url).database, isolation_level=None)  # another process's writer
    try:
        other.execute("BEGIN IMMEDIATE")
        write = asyncio.ensure_future(sqlite_store.sessions.append(session.id, "user", "written after the lock"))
        ticks = 0
        for _ in range(10):  # the loop keeps running while the write waits
            await asyncio.sleep(0.02)
            ticks += 1
        assert not write.done() and ticks == 10
        other.execute("COMMIT")
        message = await asyncio.wait_for(write, 5)
    finally:
        other.close()
    assert [m.content for m in await sqlite_store.sessions.history(session.id)] == ["written after the lock"]
    assert message.seq == 1
    # and the next write goes straight through again
    assert (await sqlite_store.sessions.append(session.id, "user", "next")).seq == 2


async def test_a_cancelled_write_still_commits_and_the_cancel_arrives_after(sqlite_store):
    import sqlite3

    from sqlalchemy import make_url

    session = await sqlite_store.sessions.open("test:cancel", source="test")
    other = sqlite3.connect(make_url(sqlite_store.db.url).database, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # makes the write wait on the writer thread
        write = asyncio.ensure_future(sqlite_store.sessions.append(session.id, "user", "kept"))
        await asyncio.sleep(0.05)
        write.cancel()
        await asyncio.sleep(0.05)
        other.execute("COMMIT")
        with pytest.raises(asyncio.CancelledError):
            await write
    finally:
        other.close()
    assert [m.content for m in await sqlite_store.sessions.history(session.id)] == ["kept"]


async def test_a_cancel_arriving_as_the_transaction_finishes_is_not_lost():
    # The caller's cancel and the transaction's completion land in the same loop iteration:
    # the caller must still see CancelledError (a lost cancel left a stopping gateway waiting
    # forever on its retention task, asleep again after "finishing" its write).
    from gateway.store.db import _uninterrupted

    transaction = asyncio.get_running_loop().create_future()
    caller = asyncio.ensure_future(_uninterrupted(transaction))
    await asyncio.sleep(0)
    transaction.set_result("committed")
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller


async def test_a_cancelled_caller_is_cancelled_even_when_its_transaction_then_fails():
    from gateway.store.db import _uninterrupted

    transaction = asyncio.get_running_loop().create_future()
    caller = asyncio.ensure_future(_uninterrupted(transaction))
    await asyncio.sleep(0)
    caller.cancel()
    await asyncio.sleep(0)
    assert not caller.done()  # it waits for the transaction to end
    transaction.set_exception(ConnectionResetError("server closed the connection"))
    with pytest.raises(asyncio.CancelledError):
        await caller


async def test_a_postgres_store_opens_no_more_connections_than_its_pool_allows(tmp_path):
    """database.pool_size + database.max_overflow bound one instance's connections, whatever
    the number of concurrent reads (the sizing rule in docs/operations.md rests on it); each
    connection is named after the store's application name in pg_stat_activity."""
    import uuid

    from conftest import NO_POSTGRES, POSTGRES_DSN, POSTGRES_URL
    from sqlalchemy import text

    from gateway.store import Store

    if not POSTGRES_URL:
        pytest.skip(NO_POSTGRES)
    import asyncpg

    name = f"gateway pool-test-{uuid.uuid4().hex[:8]}"
    store = Store(POSTGRES_URL, pool_size=2, max_overflow=1, application_name=name)
    observer = await asyncpg.connect(POSTGRES_DSN)
    counts: list[int] = []
    done = asyncio.Event()

    async def count() -> None:
        while not done.is_set():
            counts.append(
                await observer.fetchval("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name)
            )
            await asyncio.sleep(0.02)

    counting = asyncio.create_task(count())
    try:
        results = await asyncio.gather(
            *(store.db.read(lambda conn, n=n: conn.execute(text(f"SELECT {n} FROM pg_sleep(0.2)")).scalar())
              for n in range(12))
        )
    finally:
        done.set()
        await counting
        await observer.close()
        await store.close()
    assert results == list(range(12))  # every read got its turn at a connection
    assert 1 <= max(counts) <= 3, counts
