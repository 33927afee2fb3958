"""Honest spend for scheduled work (SQLite and PostgreSQL): every model call of a job counts,
quiet ticks and sub-agents included, in `/cost`, `gateway budgets`, `gateway jobs show` and the
figures the console shows, per job and per firing, today, this week and this month, with a
forecast; a capped tick opens no session and asks no model. Driven through the real gateway,
its scheduler and the fake model server."""

from __future__ import annotations

import asyncio
import io
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from fakes.channel import FakeChannel
from fakes.llm import Reply
from harness import make_config, running_gateway
from helpers import needs_bwrap
from sqlalchemy import func, select
from subagent_chat import Agents, delegate
from test_scheduler_cli import parse
from test_scheduler_support import Core

from gateway.budgets.caps import period_key
from gateway.budgets.jobs import budgets_with_jobs, cost_text, job_spend, period_starts, spend_table, tokens_text
from gateway.config import ModelPrice
from gateway.events import ThreadKey
from gateway.llm import Usage
from gateway.llm.pricing import usage_cost
from gateway.store import CounterKey
from gateway.store.job_spend import Spend, period_queries
from gateway.store.tables import sessions
from scheduler.cli import run_jobs_command
from scheduler.definitions import job_config, to_schedule

CHAT = ThreadKey("telegram", "900", "")
UTC_ZONE = ZoneInfo("UTC")
PRICE = {"input": 3, "output": 15, "cache_read": 0.3}  # USD per million tokens
QUIET_USAGE = {"prompt_tokens": 1200, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 1000}}
QUIET_COST = usage_cost(ModelPrice(**PRICE), Usage(1200, 4, cached_tokens=1000))  # 200 x 3 + 1000 x 0.3 + 4 x 15
TICK = {"name": "watch", "kind": "tick", "every": "30m", "prompt": "Anything urgent?", "deliver_to": "telegram:900"}
NIGHTLY = {"name": "nightly", "kind": "cron", "cron": "0 3 * * *", "prompt": "Write the nightly report.",
           "deliver_to": "telegram:900"}


def config_with(llm, tmp_path, *jobs, caps=(), **sections):  # noqa: ANN001, ANN002, ANN003, ANN201
    return make_config(
        llm.base_url, str(tmp_path / "ws"),
        llm={"prices": {"test-model": PRICE}, "max_tokens": 20},
        scheduler={"enabled": True, "jobs": list(jobs)},
        budgets={"caps": list(caps)},
        **sections,
    )


async def fire(h, name: str):  # noqa: ANN001, ANN201
    schedule = await h.store.schedules.by_name(name)
    run = await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
    await h.idle()
    return schedule, run


async def job_counter(store, schedule_id: int, period: str = "month"):  # noqa: ANN001, ANN201
    key = CounterKey("job", str(schedule_id), period, period_key(period, datetime.now(UTC), UTC_ZONE))
    return (await store.budgets.counters([key])).get(key)


async def test_a_quiet_tick_spends_and_every_report_counts_it(store, llm, tmp_path):
    """Three ticks answer the quiet sentinel: nothing is delivered, yet each call's tokens
    (cached ones too) and cost are the job's, the same figures as its cap's counter."""
    for _ in range(3):
        llm.reply("NOTHING_TO_REPORT", usage=QUIET_USAGE)
    config = config_with(llm, tmp_path, TICK, caps=[{"scope": "job", "period": "month", "usd": 100}])
    async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
        for _ in range(3):
            schedule, _ = await fire(h, "watch")
        assert h.channel.messages(CHAT) == [] and len(llm.requests) == 3  # quiet: nothing delivered
        spend = await job_spend(store, schedule, UTC_ZONE, datetime.now(UTC))
        for name in ("today", "this week", "this month"):
            period = spend.periods[name]
            assert (period.spend.calls, period.spend.input_tokens, period.spend.cached_tokens) == (3, 3600, 3000)
            assert (period.spend.output_tokens, period.spend.cost_nano_usd) == (12, 3 * QUIET_COST)
            assert (period.firings.total, period.firings.woke, period.firings.no_change) == (3, 3, 0)
        counter = await job_counter(store, schedule.id)
        assert (counter.used_tokens, counter.used_nano_usd) == (spend.periods["today"].spend.tokens, 3 * QUIET_COST)

        await h.say("/cost", thread=CHAT)
        await h.idle()
        cost_reply = h.channel.messages(CHAT)[-1]
    assert "Job watch (every model call, quiet ones included):" in cost_reply
    assert "today: 3 model calls, 3,600 input tokens (3,000 cached), 12 output, $0.00288" in cost_reply
    assert "3 firings (3 woke the model)" in cost_reply
    # A job added moments ago: its rate is taken over an hour at least, not extrapolated from seconds.
    assert "at the rate since it was added (under 1 h ago, taken as 1 h): 87 k tokens/day, $0.07/day" in cost_reply

    report = "\n".join(await budgets_with_jobs(store, config))
    assert "scheduled jobs (every model call, quiet ones included; periods in UTC):" in report
    assert "  watch\n" in report
    today = next(line for line in report.splitlines() if line.strip().startswith("today"))
    assert today.split() == ["today", "3", "3", "0", "0", "3", "3,600", "3,000", "12", "$0.00288"]
    assert "job / month" in report and "watch" in report.split("job / month")[1]  # the cap names the job

    out = io.StringIO()
    code = await run_jobs_command(
        parse("show", "watch"), store, config, Core(store).submit, out=out, spend=spend_table(store, config)
    )
    shown = out.getvalue()
    assert code == 0 and "spend (every model call, quiet ones and sub-agents' included):" in shown
    assert "this month" in shown and "87 k tokens/day" in shown
    firings = shown.split("recent firings:")[1].strip().splitlines()
    assert len(firings) == 3 and all("success" in f and "1 call, 1,204 tokens (1,000 cached), $0.00096" in f
                                     for f in firings)


async def test_a_jobs_sub_agent_calls_count_once(store, llm, tmp_path):
    """A run that delegates: the child's call is the job's too (its firing, its periods, its
    cap), counted once (the child's session carries the job too, and its use is added to the
    parent's run when it ends)."""
    agents = Agents()
    llm.responder = agents
    usage = {"prompt_tokens": 100, "completion_tokens": 10}
    agents.script(
        "Write the nightly report.",
        Reply(tool_calls=(delegate({"prompt": "Count the errors.", "name": "counter"}),), usage=usage),
        Reply("Nightly: 3 errors.", usage=usage),
    )
    agents.script("Count the errors.", Reply("3 errors.", usage={"prompt_tokens": 50, "completion_tokens": 5}))
    config = config_with(llm, tmp_path, NIGHTLY, caps=[{"scope": "job", "period": "day", "tokens": 100_000}])
    async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
        schedule, _ = await fire(h, "nightly")
        await h.wait_for(lambda: any("Nightly: 3 errors." in m for m in h.channel.messages(CHAT)))
        assert len(llm.requests) == 3
        (job_run,) = await store.schedules.recent_runs(schedule.id)
        (firing,) = (await store.job_spend.of_sessions([job_run.session_id])).values()
        assert (firing.calls, firing.tokens) == (3, 275)
        spend = await job_spend(store, schedule, UTC_ZONE, datetime.now(UTC))
        assert (spend.periods["today"].spend.calls, spend.periods["today"].spend.tokens) == (3, 275)
        assert (await job_counter(store, schedule.id, "day")).used_tokens == 275


async def test_a_run_stopped_at_its_timeout_still_counts_what_it_spent(store, llm, tmp_path):
    """The timeout closes the job run before its turn reports back: the run's record says 0
    tokens, but the call it made was spent, and is counted."""
    llm.tool_call("clock", {}, usage={"prompt_tokens": 300, "completion_tokens": 20})
    llm.stall("")
    config = config_with(llm, tmp_path, {**NIGHTLY, "timeout": "1s"})
    async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
        schedule = await store.schedules.by_name("nightly")
        started = await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
        await asyncio.wait_for(llm.stalled.wait(), 15)  # the first call is answered, the second hangs
        deadline = started.started_at + timedelta(seconds=1)
        await h.wait_for(lambda: datetime.now(UTC) >= deadline)  # the timeout is a time, not an event
        (stopped,) = await h.gateway.scheduler.check_timeouts()
        await h.idle()
        record = await store.schedules.get_run(stopped.id)
        assert record.status == "failed" and record.error.startswith("timeout") and record.tokens == 0
        spend = await job_spend(store, schedule, UTC_ZONE, datetime.now(UTC))
        today = spend.periods["today"].spend
        assert today.calls >= 1 and today.input_tokens >= 300 and today.output_tokens >= 20
        (firing,) = (await store.job_spend.of_sessions([record.session_id])).values()
        assert firing == today


async def test_a_capped_tick_opens_no_session_and_asks_no_model(store, llm, tmp_path):
    llm.reply("Something urgent.", usage={"prompt_tokens": 250, "completion_tokens": 250})
    # No tools: the call's reservation (its prompt's bound and whole reply) fits under the cap.
    config = config_with(llm, tmp_path, TICK, caps=[{"scope": "job", "period": "day", "tokens": 500}],
                         agent={"tools": []})
    async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
        schedule, first = await fire(h, "watch")
        await h.wait_for(lambda: bool(h.channel.messages(CHAT)))
        assert h.channel.messages(CHAT) == ["🔔 **watch**\n\nSomething urgent."]

        def job_sessions(conn):  # noqa: ANN001, ANN202
            return conn.execute(select(func.count()).where(sessions.c.schedule_id == schedule.id)).scalar_one()

        before = await store.db.read(job_sessions)
        _, second = await fire(h, "watch")
        assert second.status == "skipped" and second.error.startswith("budget: Daily budget for this job reached")
        assert second.session_id is None and await store.db.read(job_sessions) == before == 1
        assert len(llm.requests) == 1  # no model request
        spend = await job_spend(store, schedule, UTC_ZONE, datetime.now(UTC))
        today = spend.periods["today"]
        assert (today.firings.total, today.firings.woke, today.firings.capped, today.spend.calls) == (2, 1, 1, 1)


@needs_bwrap
async def test_a_checked_firing_at_its_cap_opens_no_session_either(store, llm, tmp_path):
    """The check runs first (it is what saves calls); a firing it wakes still meets the job's
    cap before any session is opened."""
    llm.reply("Ann wrote.", usage={"prompt_tokens": 250, "completion_tokens": 250})
    job = {**TICK, "check": {"command": "echo mail from Ann", "wake_when": "nonempty"}}
    config = config_with(llm, tmp_path, job, caps=[{"scope": "job", "period": "day", "tokens": 500}],
                         agent={"tools": []})
    async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
        schedule, first = await fire(h, "watch")
        await h.wait_for(lambda: bool(h.channel.messages(CHAT)))
        assert first.session_id is not None and len(llm.requests) == 1
        _, second = await fire(h, "watch")
        assert second.status == "skipped" and second.error.startswith("budget: Daily budget for this job reached")
        assert second.session_id is None and len(llm.requests) == 1
        assert (await store.schedules.get_run(second.id)).check_result["found"] == "woke"  # it was checked
        today = (await job_spend(store, schedule, UTC_ZONE, datetime.now(UTC))).periods["today"]
        assert (today.firings.woke, today.firings.capped, today.spend.calls) == (1, 1, 1)


async def test_a_job_older_than_a_week_is_forecast_at_the_last_7_days_rate(store, llm, tmp_path):
    llm.reply("NOTHING_TO_REPORT", usage=QUIET_USAGE)
    config = config_with(llm, tmp_path)
    added = datetime.now(UTC) - timedelta(days=10)
    fields = {**TICK, "name": "old-watch"}
    await store.schedules.create(to_schedule(job_config(fields), config.scheduler, source="cli", now=added), now=added)
    async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
        schedule, _ = await fire(h, "old-watch")
        spend = await job_spend(store, schedule, UTC_ZONE, datetime.now(UTC))
    # one call of 1,204 tokens and $0.00096 in the last 7 days
    assert spend.forecast.text() == "at the last 7 days' rate: 172 tokens/day, $0.000137/day"


async def test_the_spend_reads_only_the_jobs_firings_in_the_period(sqlite_store):
    """Bounded as history grows: both reads go through the index of (schedule, scheduled_for)
    and the runs of those firings' sessions, never a scan of every run or firing."""
    starts = period_starts(datetime.now(UTC), UTC_ZONE)

    def plans(conn):  # noqa: ANN001, ANN202
        found = []
        for query in period_queries(1, starts):
            compiled = query.compile(dialect=conn.dialect)
            rows = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + str(compiled), (None,) * len(compiled.positiontup))
            found.append(" / ".join(row[-1] for row in rows))
        return found

    spend_plan, firings_plan = await sqlite_store.db.read(plans)
    assert "SEARCH job_runs USING INDEX sqlite_autoindex_job_runs_1 (schedule_id=? AND scheduled_for>?)" in spend_plan
    assert "SEARCH runs USING INDEX ix_runs_session_id (session_id=?)" in spend_plan
    assert "SCAN" not in spend_plan and "SCAN" not in firings_plan
    assert "(schedule_id=? AND scheduled_for>?)" in firings_plan


def test_a_cost_says_when_it_is_unpriced_or_estimated():
    assert cost_text(Spend()) == "$0.00"  # no call, nothing spent
    assert cost_text(Spend(calls=2, input_tokens=10)) == "unpriced"  # calls the model has no price for
    assert cost_text(Spend(calls=2, cost_nano_usd=960_000, unpriced=True)) == "$0.00096 (+ unpriced calls)"
    assert cost_text(Spend(calls=1, cost_nano_usd=960_000, estimated=True)) == "~$0.00096"


def test_periods_are_calendar_periods_in_the_jobs_zone():
    zone = ZoneInfo("Europe/Berlin")
    now = datetime(2026, 3, 4, 23, 30, tzinfo=UTC)  # Thursday 00:30 in Berlin
    starts = period_starts(now, zone)
    assert starts["today"] == datetime(2026, 3, 5, tzinfo=zone)
    assert starts["this week"] == datetime(2026, 3, 2, tzinfo=zone)
    assert starts["this month"] == datetime(2026, 3, 1, tzinfo=zone)
    assert starts["last 7 days"] == now - timedelta(days=7)
    assert [tokens_text(n) for n in (850, 3140, 42_000, 1_250_000, 12_000_000)] == ["850", "3.1 k", "42 k", "1.2 M",
                                                                                    "12 M"]
