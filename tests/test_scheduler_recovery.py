"""Start-up: missed firings after a downtime, runs left by a crash, config sync, the live clock.

`start()` runs the real APScheduler clock, so these tests put their hand-moved clock near real
time: the next firings it plans lie well in the future and never fire during a test.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

import pytest
from test_scheduler_support import Core, Now, add_job, ended, make_scheduler, real_now

from gateway.config import JobConfig
from scheduler.clock import Clock
from scheduler.sync import REMOVED_FROM_CONFIG


async def downtime(store, *, misfire: str, grace: str | None = None):
    """An hourly job defined 5h10m ago whose gateway was down ever since; then a start."""
    start = real_now()
    t0 = start - timedelta(hours=5, minutes=10)
    now, core = Now(t0), Core(store)
    before = make_scheduler(store, now, core)
    job = await add_job(
        before, name="hourly", every="1h", misfire=misfire, misfire_grace=grace, deliver_to="telegram:1"
    )
    now.set(start)
    after = make_scheduler(store, now, core)
    await after.start()
    await after.stop()
    runs = sorted(await after.repo.recent_runs(job.id, limit=50), key=lambda r: r.scheduled_for)
    return job, core, runs, t0, after


async def test_run_once_within_grace_runs_the_latest_missed_firing_once(store):
    job, core, runs, t0, scheduler = await downtime(store, misfire="run_once", grace="1h")
    assert [r.status for r in runs] == ["missed"] * 4 + ["running"]
    assert [r.scheduled_for for r in runs] == [t0 + timedelta(hours=h) for h in range(1, 6)]
    assert len(core.submitted) == 1
    assert all("gateway was not running" in r.error for r in runs[:4])


async def test_run_once_beyond_grace_runs_nothing_and_records_all(store):
    job, core, runs, t0, scheduler = await downtime(store, misfire="run_once", grace="5m")
    assert [r.status for r in runs] == ["missed"] * 5 and core.submitted == []


async def test_skip_records_every_missed_firing_as_missed(store):
    job, core, runs, t0, scheduler = await downtime(store, misfire="skip")
    assert [r.status for r in runs] == ["missed"] * 5 and core.submitted == []


async def test_a_second_start_records_nothing_twice(store):
    job, core, runs, t0, scheduler = await downtime(store, misfire="skip")
    await scheduler.start()
    await scheduler.stop()
    assert await scheduler.repo.count_runs(job.id) == 5


async def test_start_plans_the_next_firing_on_the_clock(store):
    now, core = Now(real_now()), Core(store)
    scheduler = make_scheduler(store, now, core)
    job = await add_job(scheduler, name="later", every="2h")
    off = await add_job(scheduler, name="off", every="2h", enabled=False)
    await scheduler.start()
    try:
        planned = scheduler.clock.planned()
        assert planned == {job.id: job.updated_at + timedelta(hours=2)}
        await scheduler.repo.set_enabled(off.id, True, now=now())
        await scheduler.housekeeping()  # the change is noticed without a restart
        assert set(scheduler.clock.planned()) == {job.id, off.id}
    finally:
        await scheduler.stop()


async def test_a_missed_one_shot_is_recorded_and_disabled(store):
    start = real_now()
    now, core = Now(start - timedelta(hours=3)), Core(store)
    job = await add_job(make_scheduler(store, now, core), name="remind", **{"in": "1h"}, misfire="skip")
    now.set(start)
    scheduler = make_scheduler(store, now, core)
    await scheduler.start()
    await scheduler.stop()
    [row] = await scheduler.repo.recent_runs(job.id)
    assert row.status == "missed"
    assert (await scheduler.repo.get(job.id)).enabled is False


# ---- restart ---------------------------------------------------------------------------------


async def crashed_run(store, *, age: timedelta, picked_up: bool = True):
    start = real_now()
    now, core = Now(start - age), Core(store)
    first = make_scheduler(store, now, core)
    job = await add_job(
        first, now=start - age - timedelta(minutes=1), name="nightly", every="1h", deliver_to="telegram:1"
    )
    run = await first.fire(job.id, now())
    if picked_up:
        await core.pick_up(core.submitted[0])
    now.set(start)
    return job, run, core, make_scheduler(store, now, core)


async def test_a_run_left_running_by_a_crash_fails_and_runs_again_within_grace(store):
    job, run, core, restarted = await crashed_run(store, age=timedelta(minutes=5))
    [recovered] = await restarted.close_abandoned_runs()
    assert recovered.id == run.id and recovered.status == "failed" and recovered.error.startswith("restart")
    [again] = await restarted.repo.running(job.id)
    assert again.origin == "retry" and again.session_id != run.session_id
    assert len(core.submitted) == 2 and core.submitted[1].thread.thread == str(again.id)
    assert core.delivered == []


async def test_a_crashed_run_beyond_grace_is_failed_and_reported(store):
    job, run, core, restarted = await crashed_run(store, age=timedelta(hours=2))
    await restarted.close_abandoned_runs()
    assert await restarted.repo.running(job.id) == []
    assert len(core.submitted) == 1 and "restart" in core.delivered[0].text


async def test_a_run_whose_prompt_is_still_queued_is_left_to_the_core(store):
    job, run, core, restarted = await crashed_run(store, age=timedelta(minutes=5), picked_up=False)
    assert await restarted.close_abandoned_runs() == []
    assert (await restarted.repo.get_run(run.id)).status == "running"


async def test_a_run_whose_thread_is_leased_by_a_live_worker_is_left_alone(store):
    job, run, core, restarted = await crashed_run(store, age=timedelta(minutes=5))
    await store.inbox.acquire(f"thread:{core.submitted[0].thread}", "worker-2", ttl_s=60)
    assert await restarted.close_abandoned_runs() == []


async def test_a_run_with_an_interrupted_turn_is_left_for_the_core_to_continue(store):
    job, run, core, restarted = await crashed_run(store, age=timedelta(minutes=5))
    await store.runs.start(run.session_id, str(core.submitted[0].thread))  # the turn began, then the crash
    assert await restarted.close_abandoned_runs() == []
    assert (await restarted.repo.get_run(run.id)).status == "running" and len(core.submitted) == 1


async def test_the_turn_report_after_a_recovery_changes_nothing(store):
    job, run, core, restarted = await crashed_run(store, age=timedelta(hours=2))
    await restarted.close_abandoned_runs()
    await restarted.on_turn_ended(ended(core.submitted[0]))
    assert (await restarted.repo.get_run(run.id)).status == "failed" and len(core.delivered) == 1


# ---- config sync -----------------------------------------------------------------------------


async def test_config_jobs_are_created_updated_and_disabled_when_removed(store):
    now, core = Now(real_now()), Core(store)
    jobs = [
        JobConfig(name="morning", cron="0 8 * * *", prompt="Good morning", deliver_to="telegram:1"),
        JobConfig(name="ticker", kind="tick", every="15m", prompt="Anything new?", active_hours="08:00-20:00"),
    ]
    scheduler = make_scheduler(store, now, core, jobs=jobs, timezone="Europe/Berlin")
    report = await scheduler.sync_config_jobs()
    assert sorted(report.created) == ["morning", "ticker"] and not report.errors
    morning = await scheduler.repo.by_name("morning")
    assert (morning.kind, morning.spec, morning.timezone, morning.source) == (
        "cron",
        "0 8 * * *",
        "Europe/Berlin",
        "config",
    )

    again = await scheduler.sync_config_jobs()
    assert sorted(again.unchanged) == ["morning", "ticker"] and not again.changed

    now.advance(minutes=1)
    scheduler.config.jobs = [jobs[0].model_copy(update={"prompt": "Good morning, briefly"})]
    report = await scheduler.sync_config_jobs()
    assert report.updated == ["morning"] and report.disabled == ["ticker"]
    assert (await scheduler.repo.by_name("morning")).prompt == "Good morning, briefly"
    ticker = await scheduler.repo.by_name("ticker")
    assert not ticker.enabled and ticker.disabled_reason == REMOVED_FROM_CONFIG

    scheduler.config.jobs = [scheduler.config.jobs[0], jobs[1]]
    report = await scheduler.sync_config_jobs()
    assert report.updated == ["ticker"] and (await scheduler.repo.by_name("ticker")).enabled


async def test_a_bad_config_job_is_reported_and_the_stored_one_left_alone(store):
    now, core = Now(real_now()), Core(store)
    good = JobConfig(name="report", cron="0 9 * * *", prompt="Report")
    scheduler = make_scheduler(store, now, core, jobs=[good])
    await scheduler.sync_config_jobs()
    scheduler.config.jobs = [good.model_copy(update={"cron": "0 9 * *"})]
    report = await scheduler.sync_config_jobs()
    assert report.errors and "report" in report.errors[0] and "5 fields" in report.errors[0]
    kept = await scheduler.repo.by_name("report")
    assert kept.enabled and kept.spec == "0 9 * * *"


async def test_instances_starting_together_sync_the_same_config_jobs_without_failing(store, db_kind):
    """Every instance syncs `scheduler.jobs` as it starts. Made deterministic on PostgreSQL:
    another instance's insert of the job is under way (not committed) when this one, having
    read no such job, inserts it too; its start must adopt that job, not fail on the name."""
    if db_kind != "postgres":
        pytest.skip("SQLite serialises writers (BEGIN IMMEDIATE): the interleaving cannot happen")
    import asyncpg
    from conftest import dsn_of

    jobs = [JobConfig(name="morning", cron="0 8 * * *", prompt="Good morning", deliver_to="telegram:1")]
    first = make_scheduler(store, Now(real_now()), Core(store), jobs=jobs)
    await first.sync_config_jobs()
    settings = {"search_path": store.db.pg_schema} if store.db.pg_schema else {}
    other = await asyncpg.connect(dsn_of(store), server_settings=settings)
    try:
        await other.execute("CREATE TEMP TABLE theirs AS SELECT * FROM schedules; DELETE FROM schedules")
        transaction = other.transaction()
        await transaction.start()
        await other.execute("INSERT INTO schedules SELECT * FROM theirs")  # the other instance's, not committed
        second = make_scheduler(store, Now(real_now()), Core(store), jobs=jobs)
        sync = asyncio.create_task(second.sync_config_jobs())
        await asyncio.sleep(0.5)
        assert not sync.done()  # its insert waits on the other's row
        await transaction.commit()
        report = await asyncio.wait_for(sync, 10)
    finally:
        await other.close()
    assert report.unchanged == ["morning"] and not report.created and not report.errors
    assert [job.name for job in await second.repo.list(source="config")] == ["morning"]


async def test_an_operator_disable_and_a_relative_one_shot_survive_a_resync(store):
    now, core = Now(real_now()), Core(store)
    jobs = [JobConfig(name="daily", cron="0 9 * * *", prompt="p"), JobConfig(name="soon", **{"in": "2h"}, prompt="p")]
    scheduler = make_scheduler(store, now, core, jobs=jobs)
    await scheduler.sync_config_jobs()
    daily, soon = await scheduler.repo.by_name("daily"), await scheduler.repo.by_name("soon")
    await scheduler.repo.set_enabled(daily.id, False, reason="disabled by operator")
    now.advance(minutes=30)
    report = await scheduler.sync_config_jobs()
    assert sorted(report.unchanged) == ["daily", "soon"]
    assert not (await scheduler.repo.by_name("daily")).enabled
    assert (await scheduler.repo.by_name("soon")).spec == soon.spec


# ---- the live clock --------------------------------------------------------------------------


async def test_the_clock_calls_back_with_the_planned_firing_time():
    due: asyncio.Queue = asyncio.Queue()

    async def on_due(schedule_id, when):
        await due.put((schedule_id, when))

    async def nothing():
        return None

    clock = Clock(on_due, nothing, housekeeping_s=3600)
    clock.start()
    try:
        when = real_now() + timedelta(seconds=1)
        clock.plan(7, when)
        assert await asyncio.wait_for(due.get(), timeout=10) == (7, when)
        assert clock.planned() == {}
    finally:
        clock.stop()


async def test_a_firing_cut_short_by_the_gateway_stopping_is_one_line_not_a_traceback(caplog):
    caplog.set_level(logging.INFO, logger="scheduler.clock")
    started, never = asyncio.Event(), asyncio.Event()

    async def on_due(schedule_id, when):  # noqa: ANN001, ANN202
        started.set()
        await never.wait()

    async def nothing():
        return None

    clock = Clock(on_due, nothing, housekeeping_s=3600)
    clock.start()
    try:
        clock.plan(7, real_now())
        await asyncio.wait_for(started.wait(), timeout=10)
        [firing] = [t for t in asyncio.all_tasks() if "run_coroutine_job" in repr(t)]
        firing.cancel()  # what the loop does to the tasks still running when the gateway stops
        await asyncio.wait({firing}, timeout=10)
    finally:
        clock.stop()
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []
    assert "firing schedule 7 at" in caplog.text and "interrupted by the gateway stopping" in caplog.text


async def test_a_started_scheduler_fires_a_one_shot_through_the_clock(sqlite_store):
    core = Core(sqlite_store)
    scheduler = make_scheduler(sqlite_store, None, core)
    job = await add_job(scheduler, name="soon", **{"in": "1s"})
    await scheduler.start()
    try:
        for _ in range(100):
            if core.submitted:
                break
            await asyncio.sleep(0.1)
        [message] = core.submitted
        [run] = await scheduler.repo.recent_runs(job.id)
        assert run.scheduled_for.isoformat() == job.spec and message.event_id == f"job:{run.id}"
        assert scheduler.clock.planned() == {}
    finally:
        await scheduler.stop()
