"""The checklist tick and the idle backoff through the real scheduler, on a hand-held clock: a
tick whose checklist has nothing new calls no model and records `skipped (no change)`; new items
wake it with the checklist after the job's prompt; an idle job's interval doubles up to
`max_every` and comes back to `every` when it wakes, and a stretched interval is not missed."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from test_scheduler_support import Core, Now, add_job, ended

from gateway.config import AgentConfig, SchedulerConfig
from gateway.files.checklists import ChecklistFiles
from gateway.jobs.checks import JobChecks, job_dir
from gateway.store.schedules import JobRunRecord
from gateway.tools.sandbox import sandbox_status
from scheduler.jobs import Scheduler

T0 = datetime(2025, 5, 1, 8, 0, tzinfo=UTC)
PROMPT = "Work through the checklist; say only what needs me."


def make(store, tmp_path: Path, now: Now, core: Core) -> tuple[Scheduler, ChecklistFiles]:  # noqa: ANN001
    files = ChecklistFiles(tmp_path / "ws")
    scheduler = Scheduler(
        store, SchedulerConfig(), submit=core.submit, deliver=core.deliver, now=now, manual_clock=True,
        read_checklist=files.read,
    )
    return scheduler, files


async def heartbeat(scheduler: Scheduler, **fields: Any):  # noqa: ANN201
    values = dict(name="heartbeat", kind="tick", every="1m", checklist="heartbeat.md", prompt=PROMPT,
                  deliver_to="telegram:900")
    return await add_job(scheduler, **{**values, **fields})


async def step(scheduler: Scheduler, now: Now) -> tuple[datetime, JobRunRecord]:
    """Move the time to the next planned firing and run it; the firing's row."""
    due = scheduler.clock.next_due()  # type: ignore[union-attr]
    assert due is not None, "nothing planned"
    schedule_id, when = due
    now.set(when)
    await scheduler.clock.run_next()  # type: ignore[union-attr]
    [row] = [r for r in await scheduler.repo.recent_runs(schedule_id, limit=5) if r.scheduled_for == when]
    return when, row


async def test_an_empty_checklist_calls_no_model_and_records_the_skip(store, tmp_path):
    now, core = Now(T0), Core(store)
    scheduler, files = make(store, tmp_path, now, core)
    job = await heartbeat(scheduler)
    await scheduler.start()
    _, missing = await step(scheduler, now)  # no file yet: empty
    files.write("heartbeat.md", "# Heartbeat\n<!-- one item a line -->\n- [x] paid the rent\n")
    _, empty = await step(scheduler, now)
    for row in (missing, empty):
        assert (row.status, row.error, row.session_id) == ("skipped", "no change", None)
        assert row.check_result["found"] == "no change" and row.check_result["checklist"]["open_items"] == 0
    assert core.submitted == [] and core.delivered == []
    assert await scheduler.repo.count_runs(job.id) == 2


async def test_new_items_wake_the_tick_once_with_the_checklist_after_the_prompt(store, tmp_path):
    now, core = Now(T0), Core(store)
    scheduler, files = make(store, tmp_path, now, core)
    await heartbeat(scheduler)
    await scheduler.start()
    files.write("heartbeat.md", "# Heartbeat\n- [ ] water the plants\n- [x] paid the rent\n")
    _, woke = await step(scheduler, now)
    assert woke.status == "running" and woke.session_id is not None
    [message] = core.submitted
    assert message.text.startswith(PROMPT)  # the job's words first: the same at every firing
    block = message.text[message.text.index("## Checklist (checklists/heartbeat.md"):]
    assert "- [ ] water the plants" in block and "paid the rent" not in block
    assert message.text.index("NOTHING_TO_REPORT") < message.text.index("## Checklist")
    # While it runs, the next firing is "still running"; once it succeeded, the same checklist
    # is answered and the firings after it are skipped.
    _, busy = await step(scheduler, now)
    assert busy.status == "skipped" and busy.error.startswith("still running")
    await scheduler.on_turn_ended(ended(message, reply="Water the plants today."))
    _, answered = await step(scheduler, now)
    assert (answered.status, answered.error) == ("skipped", "no change")
    assert len(core.submitted) == 1 and len(core.delivered) == 1
    # Checking the item off leaves nothing open; adding one wakes the tick again.
    files.write("heartbeat.md", "- [x] water the plants\n")
    assert (await step(scheduler, now))[1].error == "no change"
    files.write("heartbeat.md", "- [x] water the plants\n- [ ] book the dentist\n")
    _, again = await step(scheduler, now)
    assert again.status == "running" and "book the dentist" in core.submitted[-1].text


async def test_a_failed_run_does_not_answer_its_checklist(store, tmp_path):
    now, core = Now(T0), Core(store)
    scheduler, files = make(store, tmp_path, now, core)
    await heartbeat(scheduler)
    await scheduler.start()
    files.write("heartbeat.md", "- [ ] water the plants\n")
    await step(scheduler, now)
    await scheduler.on_turn_ended(ended(core.submitted[0], stage="FAILED", reply=""))
    _, retried = await step(scheduler, now)
    assert retried.status == "running" and len(core.submitted) == 2


async def test_run_now_wakes_the_model_whatever_the_checklist(store, tmp_path):
    now, core = Now(T0), Core(store)
    scheduler, files = make(store, tmp_path, now, core)
    await heartbeat(scheduler)
    manual = await scheduler.run_now("heartbeat")
    assert manual.status == "running" and len(core.submitted) == 1


# ---- idle backoff ------------------------------------------------------------------------------


async def test_an_idle_tick_doubles_its_interval_up_to_max_every_and_wakes_back_to_every(store, tmp_path):
    now, core = Now(T0), Core(store)
    scheduler, files = make(store, tmp_path, now, core)
    job = await heartbeat(scheduler, idle_backoff={"max_every": "8m"})
    await scheduler.start()
    times = [(await step(scheduler, now))[0] for _ in range(6)]
    gaps = [int((b - a).total_seconds() // 60) for a, b in zip([T0, *times], times, strict=False)]
    assert gaps == [1, 2, 4, 8, 8, 8]
    assert (await scheduler.repo.state(job.id)).backoff_s == 480
    files.write("heartbeat.md", "- [ ] water the plants\n")
    woke_at, woke = await step(scheduler, now)
    assert woke.status == "running"
    await scheduler.on_turn_ended(ended(core.submitted[0]))
    next_at, answered = await step(scheduler, now)
    assert next_at - woke_at == timedelta(minutes=1) and answered.error == "no change"  # back to `every`
    assert (await step(scheduler, now))[0] - next_at == timedelta(minutes=2)  # and idle again
    rows = await scheduler.repo.recent_runs(job.id, limit=50)
    assert len(rows) == 9 and len({r.scheduled_for for r in rows}) == 9  # every firing recorded once
    assert not [r for r in rows if r.status == "missed"]


async def test_a_stretched_interval_is_not_counted_as_missed_firings(store, tmp_path):
    now, core = Now(T0), Core(store)
    scheduler, _ = make(store, tmp_path, now, core)
    job = await heartbeat(scheduler, idle_backoff={"max_every": "8m"})
    await scheduler.start()
    for _ in range(5):
        last, _row = await step(scheduler, now)
    await scheduler.stop()  # the gateway is down for 30 minutes, the tick backed off to 8m
    now.set(last + timedelta(minutes=30))
    restarted, _ = make(store, tmp_path, now, core)
    await restarted.start()
    rows = sorted(await restarted.repo.recent_runs(job.id, limit=50), key=lambda r: r.scheduled_for)
    missed = [r.scheduled_for for r in rows if r.status == "missed"]
    # 8-minute firings fell in the downtime: two missed, the latest run on start (and skipped).
    assert missed == [last + timedelta(minutes=8), last + timedelta(minutes=16)]
    assert rows[-1].scheduled_for == last + timedelta(minutes=24) and rows[-1].error == "no change"
    assert restarted.clock.planned() == {job.id: last + timedelta(minutes=32)}


async def test_a_job_defined_again_starts_from_its_every(store, tmp_path):
    now, core = Now(T0), Core(store)
    scheduler, _ = make(store, tmp_path, now, core)
    job = await heartbeat(scheduler, idle_backoff={"max_every": "1h"})
    await scheduler.start()
    for _ in range(4):
        last, _row = await step(scheduler, now)
    assert (await scheduler.repo.state(job.id)).backoff_s == 16 * 60
    defined = last + timedelta(seconds=10)
    await scheduler.repo.update(job.id, now=defined, prompt="Something else.")
    await scheduler.reload()
    assert scheduler.clock.planned()[job.id] == defined + timedelta(minutes=1)  # on its own grid again
    first, _ = await step(scheduler, now)
    second, _ = await step(scheduler, now)
    assert second - first == timedelta(minutes=2)  # the backoff starts over from `every`


@pytest.mark.skipif(
    bool(sandbox_status("auto").problem), reason=f"bubblewrap cannot sandbox here: {sandbox_status('auto').problem}"
)
async def test_an_every_job_backs_off_while_its_check_finds_nothing_and_comes_back_when_it_does(store, tmp_path):
    now, core = Now(T0), Core(store)
    agent = AgentConfig(workspace=str(tmp_path / "ws"))
    scheduler = Scheduler(
        store, SchedulerConfig(), submit=core.submit, deliver=core.deliver, now=now, manual_clock=True,
        checks=JobChecks(agent),
    )
    await add_job(
        scheduler, name="feed", every="1m", check={"command": "cat news.txt"}, idle_backoff={"max_every": "4m"},
    )
    (job_dir(agent, "feed") / "news.txt").write_text("")
    await scheduler.start()
    times = [(await step(scheduler, now))[0] for _ in range(4)]
    assert [int((b - a).total_seconds() // 60) for a, b in zip([T0, *times], times, strict=False)] == [1, 2, 4, 4]
    (job_dir(agent, "feed") / "news.txt").write_text("the invoice arrived\n")
    woke_at, woke = await step(scheduler, now)
    assert woke.status == "running" and "the invoice arrived" in core.submitted[0].text
    assert (await step(scheduler, now))[0] - woke_at == timedelta(minutes=1)  # back to `every`


async def test_two_schedulers_firing_the_same_checklist_tick_record_it_once_and_wake_once(store, tmp_path):
    now, core = Now(T0), Core(store)
    a, files = make(store, tmp_path, now, core)
    b, _ = make(store, tmp_path, now, core)
    job = await heartbeat(a)
    when = T0 + timedelta(minutes=1)
    now.set(when)
    await asyncio.gather(a.fire(job.id, when), b.fire(job.id, when))  # empty: skipped, once
    files.write("heartbeat.md", "- [ ] water the plants\n")
    later = when + timedelta(minutes=1)
    now.set(later)
    await asyncio.gather(a.fire(job.id, later), b.fire(job.id, later))  # new item: one wake
    rows = sorted(await a.repo.recent_runs(job.id), key=lambda r: r.scheduled_for)
    assert [(r.scheduled_for, r.status) for r in rows] == [(when, "skipped"), (later, "running")]
    assert len(core.submitted) == 1
