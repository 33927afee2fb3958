"""The scheduler driven with a hand-moved clock: firing, outcomes, overlap, kill, timeouts."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from test_scheduler_support import Core, Now, add_job, ended, make_scheduler

from gateway.events import Outbound, Prompt, ThreadKey
from scheduler.delivery import RERUN_LABEL
from scheduler.jobs import Scheduler

T0 = datetime(2025, 5, 1, 8, 0, tzinfo=UTC)
TARGET = ThreadKey("telegram", "-1001", "5")


async def setup(store, **config) -> tuple[Scheduler, Core, Now]:
    now = Now(T0)
    core = Core(store)
    return make_scheduler(store, now, core, **config), core, now


async def test_a_firing_opens_an_ephemeral_headless_session_and_submits_the_prompt(store):
    scheduler, core, now = await setup(store)
    job = await add_job(
        scheduler, name="daily", cron="0 9 * * *", deliver_to="telegram:-1001:5", max_rounds=4, max_tokens=900
    )
    now.set(T0 + timedelta(hours=1, seconds=2))
    run = await scheduler.fire(job.id, T0 + timedelta(hours=1))

    assert run.status == "running" and run.session_id is not None
    [message] = core.submitted
    assert message.thread == ThreadKey("cron", "daily", str(run.id))
    assert message.sender.id == "scheduler" and message.text == "Summarise the news"
    assert message.event_id == f"job:{run.id}"
    session = await store.sessions.get(run.session_id)
    assert (session.kind, session.source, session.interactive, session.ephemeral) == ("cron", "cron", False, True)
    assert (session.schedule_id, session.max_rounds, session.max_tokens) == (job.id, 4, 900)
    assert session.thread_key == str(message.thread)


async def test_the_same_firing_is_claimed_once(store):
    scheduler, core, now = await setup(store)
    job = await add_job(scheduler, name="once-only", every="1h")
    when = T0 + timedelta(hours=1)
    now.set(when)
    first = await scheduler.fire(job.id, when)
    second = await scheduler.fire(job.id, when)
    assert first is not None and second is None
    assert len(core.submitted) == 1
    assert await scheduler.repo.count_runs(job.id) == 1


async def test_success_is_recorded_and_delivered_with_a_header(store):
    scheduler, core, now = await setup(store)
    job = await add_job(scheduler, name="news", cron="0 9 * * *", deliver_to="telegram:-1001:5")
    run = await scheduler.fire(job.id, now())
    await scheduler.on_turn_ended(ended(core.submitted[0], reply="Three new papers.", tokens=1234, cost_nano_usd=5600))

    [message] = core.delivered
    assert isinstance(message, Outbound) and message.thread == TARGET
    assert message.key == f"job:{run.id}:result"
    assert message.text.startswith("⏰ **news**") and "Three new papers." in message.text
    closed = await scheduler.repo.get_run(run.id)
    assert (closed.status, closed.tokens, closed.cost_nano_usd, closed.run_id) == ("success", 1234, 5600, 77)
    assert closed.delivered == ["msg-1"] and closed.finished_at is not None


async def test_turn_endings_of_other_threads_and_repeats_are_ignored(store):
    scheduler, core, now = await setup(store)
    job = await add_job(scheduler, name="news", cron="0 9 * * *", deliver_to="slack:C1")
    await scheduler.fire(job.id, now())
    first = ended(core.submitted[0])
    await scheduler.on_turn_ended(first)
    await scheduler.on_turn_ended(first)  # reported twice: delivered once
    await scheduler.on_turn_ended(ended(core.submitted[0], stage="SUCCESS").__class__(
        thread=ThreadKey("telegram", "1", ""), session_id=9, run_id=9, stage="SUCCESS", end_reason="reply", reply="hi"))
    assert len(core.delivered) == 1 and core.delivered[0].thread == ThreadKey("slack", "C1", "")


async def test_auto_denied_calls_are_listed_with_a_rerun_button_backed_by_a_prompt_row(store):
    scheduler, core, now = await setup(store)
    job = await add_job(
        scheduler, name="cleanup", cron="0 3 * * *", deliver_to="telegram:-1001:5", prompt="Clean the tmp dir"
    )
    run = await scheduler.fire(job.id, now())
    denied = ("shell(command='rm -rf /tmp/cache')",)
    await scheduler.on_turn_ended(ended(core.submitted[0], reply="I could not clean up.", auto_denied=denied))

    [notice] = core.delivered
    assert isinstance(notice, Prompt) and notice.kind == "notice" and notice.thread == TARGET
    assert "I could not clean up." in notice.text and "rm -rf /tmp/cache" in notice.text
    [[button]] = notice.buttons
    assert button.label == RERUN_LABEL and button.token.endswith(".r")
    prompt = await store.prompts.by_token(button.token.removesuffix(".r"))
    assert prompt.kind == "rerun" and prompt.status == "pending" and prompt.thread_key == str(TARGET)
    assert prompt.payload == {"text": "Clean the tmp dir", "schedule_id": job.id, "job_run_id": run.id}
    assert prompt.session_id == run.session_id and prompt.message_ids == ["msg-1"]
    assert (await scheduler.repo.get_run(run.id)).status == "success"


async def test_a_quiet_tick_delivers_nothing_but_is_recorded(store):
    scheduler, core, now = await setup(store, quiet_sentinel="NOTHING_TO_REPORT")
    tick = await add_job(
        scheduler, name="inbox-watch", kind="tick", every="30m", deliver_to="slack:C9", prompt="Check the inbox"
    )
    quiet = await scheduler.fire(tick.id, now())
    assert core.submitted[0].thread.channel == "tick"
    assert "reply with exactly NOTHING_TO_REPORT" in core.submitted[0].text
    await scheduler.on_turn_ended(ended(core.submitted[0], reply="  NOTHING_TO_REPORT \n"))
    assert core.delivered == []
    assert (await scheduler.repo.get_run(quiet.id)).status == "success"

    now.advance(minutes=30)
    await scheduler.fire(tick.id, now())
    await scheduler.on_turn_ended(ended(core.submitted[1], reply="A mail from the bank."))
    [message] = core.delivered
    assert message.text.startswith("🔔 **inbox-watch**") and "bank" in message.text


async def test_overlap_records_the_second_firing_as_skipped(store):
    scheduler, core, now = await setup(store)
    job = await add_job(scheduler, name="slow", every="1h")
    first = await scheduler.fire(job.id, T0)
    now.advance(hours=1)
    second = await scheduler.fire(job.id, now())
    assert second.status == "skipped" and f"#{first.id}" in second.error
    assert len(core.submitted) == 1
    await scheduler.on_turn_ended(ended(core.submitted[0]))
    now.advance(hours=1)
    third = await scheduler.fire(job.id, now())
    assert third.status == "running" and len(core.submitted) == 2


async def test_failure_is_recorded_and_notified(store):
    scheduler, core, now = await setup(store)
    job = await add_job(scheduler, name="report", cron="0 9 * * *", deliver_to="telegram:-1001:5")
    run = await scheduler.fire(job.id, now())
    await scheduler.on_turn_ended(
        ended(core.submitted[0], stage="FAILED", reply="", error="LLM unavailable after 4 retries")
    )
    closed = await scheduler.repo.get_run(run.id)
    assert closed.status == "failed" and closed.error == "LLM unavailable after 4 retries"
    [message] = core.delivered
    assert message.key == f"job:{run.id}:failure" and "report" in message.text and "LLM unavailable" in message.text


async def test_failure_without_notify_on_failure_stays_silent(store):
    scheduler, core, now = await setup(store)
    job = await add_job(
        scheduler, name="quiet-fail", cron="0 9 * * *", deliver_to="telegram:1", notify_on_failure=False
    )
    run = await scheduler.fire(job.id, now())
    await scheduler.on_turn_ended(ended(core.submitted[0], stage="FAILED", end_reason="budget", reply=""))
    assert core.delivered == []
    assert (await scheduler.repo.get_run(run.id)).error == "budget"


async def test_a_failed_delivery_is_noted_on_the_run_and_loses_the_outcome_nothing(store):
    now = Now(T0)
    core = Core(store, fail_delivery=True)
    scheduler = make_scheduler(store, now, core)
    job = await add_job(scheduler, name="news", cron="0 9 * * *", deliver_to="telegram:1")
    run = await scheduler.fire(job.id, now())
    await scheduler.on_turn_ended(ended(core.submitted[0]))
    closed = await scheduler.repo.get_run(run.id)
    assert closed.status == "success" and "delivery failed: chat unreachable" in closed.error


async def test_a_submit_failure_fails_the_run_and_says_so(store):
    now = Now(T0)
    core = Core(store)

    async def broken_submit(events, *, cursor=None):
        raise RuntimeError("database is locked")

    scheduler = Scheduler(
        store, make_scheduler(store, now, core).config, submit=broken_submit, deliver=core.deliver, now=now
    )
    job = await add_job(scheduler, name="news", cron="0 9 * * *", deliver_to="telegram:1")
    run = await scheduler.fire(job.id, now())
    assert run.status == "failed" and "database is locked" in run.error
    assert "failed" in core.delivered[0].text


async def test_kill_submits_stop_and_the_canceled_turn_closes_the_run(store):
    scheduler, core, now = await setup(store)
    job = await add_job(scheduler, name="long", every="1h", deliver_to="telegram:1")
    run = await scheduler.fire(job.id, now())
    await core.pick_up(core.submitted[0])
    killed = await scheduler.kill("long")
    assert [r.id for r in killed] == [run.id]
    [stop] = core.stops()
    assert stop.thread == core.submitted[0].thread and stop.event_id != core.submitted[0].event_id
    assert (await scheduler.repo.get_run(run.id)).status == "running"
    await scheduler.on_turn_ended(ended(core.submitted[0], stage="CANCELED", reply=""))
    closed = await scheduler.repo.get_run(run.id)
    assert closed.status == "canceled" and closed.error == "killed by operator"
    assert core.delivered == []
    assert await scheduler.kill("long") == [] and await scheduler.kill("nope") is None


async def test_kill_before_the_turn_started_drops_the_queued_prompt(store):
    scheduler, core, now = await setup(store)
    job = await add_job(scheduler, name="queued", every="1h")
    run = await scheduler.fire(job.id, now())
    await scheduler.kill("queued")
    assert core.stops() == []
    assert (await store.inbox.get_by_event(f"job:{run.id}")).status == "dropped"
    assert (await scheduler.repo.get_run(run.id)).status == "canceled"


async def test_a_run_past_its_timeout_is_stopped_and_failed(store):
    scheduler, core, now = await setup(store)
    job = await add_job(scheduler, name="hangs", every="1h", timeout="10m", deliver_to="telegram:1")
    run = await scheduler.fire(job.id, now())
    now.advance(minutes=9)
    assert await scheduler.check_timeouts() == []
    now.advance(minutes=2)
    [stopped] = await scheduler.check_timeouts()
    assert stopped.id == run.id and stopped.status == "failed" and stopped.error.startswith("timeout")
    [stop] = core.stops()
    assert stop.event_id == f"job:{run.id}:timeout" and stop.thread == core.submitted[0].thread
    assert "timeout" in core.delivered[0].text
    await scheduler.on_turn_ended(ended(core.submitted[0], stage="CANCELED", reply=""))  # the late report
    assert (await scheduler.repo.get_run(run.id)).status == "failed" and len(core.delivered) == 1


async def test_the_scheduler_default_timeout_applies_when_the_job_sets_none(store):
    scheduler, core, now = await setup(store, timeout="30m")
    job = await add_job(scheduler, name="default-limit", every="1h")
    await scheduler.fire(job.id, now())
    now.advance(minutes=31)
    assert len(await scheduler.check_timeouts()) == 1


async def test_a_one_shot_job_is_disabled_after_it_fires(store):
    scheduler, core, now = await setup(store)
    job = await add_job(scheduler, name="remind", **{"in": "20m"}, deliver_to="telegram:1")
    now.advance(minutes=20)
    run = await scheduler.fire(job.id, now())
    assert run.status == "running"
    after = await scheduler.repo.get(job.id)
    assert not after.enabled and after.disabled_reason == "one-shot done"


async def test_a_disabled_job_does_not_fire_but_run_now_does(store):
    scheduler, core, now = await setup(store)
    job = await add_job(scheduler, name="paused", every="1h", enabled=False)
    assert await scheduler.fire(job.id, now()) is None
    manual = await scheduler.run_now("paused")
    assert manual.status == "running" and manual.origin == "manual"
    assert await scheduler.run_now("missing") is None


async def test_a_firing_later_than_its_allowance_is_recorded_missed(store):
    scheduler, core, now = await setup(store)
    job = await add_job(scheduler, name="strict", every="1h", misfire="skip")
    now.set(T0 + timedelta(hours=1, minutes=5))
    assert await scheduler.fire(job.id, T0 + timedelta(hours=1)) is None
    [row] = await scheduler.repo.recent_runs(job.id)
    assert row.status == "missed" and "due 300s ago" in row.error and core.submitted == []
