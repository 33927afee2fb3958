"""What a job's checks remember between firings, and what a firing's check found, on both engines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from test_scheduler_support import Core, Now, add_job, make_scheduler

T0 = datetime(2025, 5, 1, 8, 0, tzinfo=UTC)


async def test_a_job_without_checks_has_an_empty_state_and_saving_keeps_other_fields(store):
    scheduler = make_scheduler(store, Now(T0), Core(store))
    job = await add_job(scheduler, name="watch", every="30m", check={"command": "echo hi"})
    assert job.check_spec == {"command": "echo hi", "wake_when": "changed", "timeout_s": 30, "max_output": 16384,
                              "network": False}
    empty = await scheduler.repo.state(job.id)
    assert (empty.output_hash, empty.failures, empty.failure_reported, empty.updated_at) == (None, 0, False, None)

    await scheduler.repo.save_state(job.id, output_hash="a" * 64, etag='"v1"', now=T0)
    state = await scheduler.repo.save_state(job.id, failures=2, now=T0 + timedelta(minutes=1))
    later = T0 + timedelta(minutes=1)
    assert (state.output_hash, state.etag, state.failures, state.updated_at) == ("a" * 64, '"v1"', 2, later)
    assert await scheduler.repo.state(job.id) == state


async def test_a_run_records_what_its_check_found_and_removal_takes_the_state_along(store):
    scheduler = make_scheduler(store, Now(T0), Core(store))
    job = await add_job(scheduler, name="watch", every="30m", check={"url": "https://example.com/feed"})
    run = await scheduler.repo.claim(job.id, T0, now=T0)
    found = {"found": "no change", "hash": "b" * 64, "bytes": 12}
    closed = await scheduler.repo.finish(run.id, status="skipped", error="no change", check_result=found, now=T0)
    assert (closed.status, closed.error, closed.check_result) == ("skipped", "no change", found)

    await scheduler.repo.save_state(job.id, output_hash="b" * 64)
    assert await scheduler.repo.remove(job.id)
    assert (await scheduler.repo.state(job.id)).output_hash is None
