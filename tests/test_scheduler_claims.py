"""Exactly-once firings when two schedulers (two processes' stores) share one database."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import text
from test_scheduler_support import Core, Now, add_job, make_scheduler, real_now

from gateway.store import Store


async def second_store(store: Store) -> Store:
    """Another connection pool on the same database, as a second gateway process would have."""
    if store.is_sqlite:
        return Store(store.db.url)
    schema = await store.db.read(lambda conn: conn.execute(text("select current_schema()")).scalar_one())
    return Store(store.db.url, pg_schema=schema)


async def test_two_schedulers_firing_the_same_times_concurrently_run_each_once(store):
    other = await second_store(store)
    try:
        now = Now(real_now())
        core_a, core_b = Core(store), Core(other)
        a, b = make_scheduler(store, now, core_a), make_scheduler(other, now, core_b)
        job = await add_job(a, name="contended", every="1h")
        times = [now() - timedelta(seconds=s) for s in range(0, 20, 2)]
        results = await asyncio.gather(*(s.fire(job.id, t) for t in times for s in (a, b, a, b)))

        claimed = [r for r in results if r is not None]
        assert len(claimed) == len(times)  # one claim per firing time, whoever won it
        assert sorted(r.scheduled_for for r in claimed) == sorted(times)
        runs = await a.repo.recent_runs(job.id, limit=100)
        assert len(runs) == len(times)
        # one firing ran; the others found it running and were recorded as skipped
        assert sorted(r.status for r in runs).count("running") == 1
        assert len(core_a.submitted) + len(core_b.submitted) == 1
    finally:
        await other.close()


async def test_two_schedulers_claiming_one_firing_many_times_start_one_session(store):
    other = await second_store(store)
    try:
        now = Now(real_now())
        core_a, core_b = Core(store), Core(other)
        a, b = make_scheduler(store, now, core_a), make_scheduler(other, now, core_b)
        jobs = [await add_job(a, name=f"job-{i}", every="1h") for i in range(5)]
        when = now()
        results = await asyncio.gather(*(s.fire(j.id, when) for j in jobs for s in (a, b) * 3))
        assert len([r for r in results if r is not None]) == len(jobs)
        submitted = core_a.submitted + core_b.submitted
        assert sorted(m.thread.chat for m in submitted) == sorted(j.name for j in jobs)
        sessions = {(await a.repo.recent_runs(j.id))[0].session_id for j in jobs}
        assert len(sessions) == len(jobs) and None not in sessions
    finally:
        await other.close()
