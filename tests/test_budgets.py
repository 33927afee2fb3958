"""Spend caps, checked before every LLM call (SQLite and PostgreSQL): the counters'
conditional reservations, a per-user cap reached mid-conversation through Telegram and Slack,
two instances racing at a cap, a job cap skipping a scheduled run, an unpriced model, alerts,
`/cost` and `gateway budgets`."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from fakes.channel import FakeChannel
from fakes.llm import FakeLLM, Reply
from harness import ALICE, BOB, make_config, running_gateway
from test_slack_e2e import running as slack_running
from test_slack_e2e import slack_config
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import running, settle, texts, tg_config

from gateway.budgets import budgets_report
from gateway.budgets.caps import Caps, Payer, period_key, resets_at
from gateway.config import CapConfig, LLMConfig
from gateway.events import InboundMessage, ThreadKey
from gateway.store import CounterKey, Limit, Refused, Reserved, Store

PERSON, FRIEND, ADMIN = 43, 44, 7
# $1000 per million tokens: $0.001 a token, so the figures below read easily.
PRICED = {"model": "test-model", "prices": {"test-model": {"input": 1000, "output": 1000}}, "max_tokens": 20}
DOLLAR = {"prompt_tokens": 900, "completion_tokens": 100}  # $1.00 a call
USER_CAP = {"caps": [{"scope": "user", "period": "day", "usd": 2.00}]}
NO_TOOLS = {"tools": []}  # small requests: the reservation's prompt bound stays small
REACHED = "⚠️ Daily budget for you reached ($2.00); it resets at 00:00 UTC."


def priced(config):  # noqa: ANN001, ANN201
    """The config with PRICED llm settings (tg_config and slack_config take `llm` as the fake)."""
    return config.model_copy(update={"llm": LLMConfig.model_validate({**config.llm.model_dump(), **PRICED})})


def dollar_replies(request: dict[str, Any]) -> Reply:
    return Reply("answer", usage=DOLLAR)


# ---- periods and words -------------------------------------------------------------------


def test_periods_are_calendar_periods_in_the_scheduler_timezone():
    zone = ZoneInfo("Europe/Berlin")
    late = datetime(2026, 12, 31, 23, 30, tzinfo=UTC)  # already 2027 in Berlin
    assert period_key("day", late, zone) == "2027-01-01"
    assert period_key("month", late, zone) == "2027-01"
    assert period_key("week", late, zone) == "2026-W53"
    assert resets_at("day", late, zone) == datetime(2027, 1, 2, tzinfo=zone)
    assert resets_at("month", late, zone) == datetime(2027, 2, 1, tzinfo=zone)
    assert resets_at("week", late, zone) == datetime(2027, 1, 4, tzinfo=zone)  # the next Monday


def test_a_reached_cap_says_whose_what_and_when_it_resets():
    config = make_config(
        "http://x",
        "/tmp",
        budgets={
            "caps": [
                {"scope": "user", "period": "day", "usd": 2},
                {"scope": "chat", "period": "month", "tokens": 5_000_000},
            ]
        },
    )
    caps = Caps(config)
    now = datetime(2026, 12, 3, 12, tzinfo=UTC)
    user, chat = config.budgets.caps
    assert caps.reached_text(user, now) == "Daily budget for you reached ($2.00); it resets at 00:00 UTC."
    assert (
        caps.reached_text(chat, now)
        == "Monthly budget for this chat reached (5,000,000 tokens); it resets on 2027-01-01 at 00:00 UTC."
    )
    applied = caps.applied(Payer(user="telegram:1", chat="telegram:-5"), now)
    assert [(a.key.scope, a.key.subject, a.key.period_key) for a in applied] == [
        ("user", "telegram:1", "2026-12-03"),
        ("chat", "telegram:-5", "2026-12"),
    ]


def test_a_cap_needs_a_limit():
    with pytest.raises(ValueError):
        CapConfig(scope="user", period="day")


# ---- the counters ------------------------------------------------------------------------

KEY = CounterKey("user", "telegram:1", "day", "2026-12-03")


async def test_a_reservation_takes_the_worst_case_and_settling_keeps_what_was_used(store: Store):
    limit = Limit(KEY, nano_usd=1000, tokens=None)
    first = await store.budgets.reserve([limit], nano_usd=600, tokens=10, ttl_s=60)
    assert isinstance(first, Reserved)
    second = await store.budgets.reserve([limit], nano_usd=600, tokens=10, ttl_s=60)
    assert isinstance(second, Refused) and second.counter.reserved_nano_usd == 600  # 600 + 600 > 1000
    (after,) = await store.budgets.settle(first.id, nano_usd=250, tokens=7)
    assert (after.used_nano_usd, after.reserved_nano_usd, after.used_tokens, after.reserved_tokens) == (250, 0, 7, 0)
    assert isinstance(await store.budgets.reserve([limit], nano_usd=600, tokens=10, ttl_s=60), Reserved)
    assert await store.budgets.settle(first.id, nano_usd=1, tokens=1) == []  # settled once


async def test_a_refusal_on_one_counter_reserves_nothing_on_the_others(store: Store):
    other = CounterKey("global", "", "month", "2026-12")
    tight = Limit(KEY, nano_usd=None, tokens=5)
    loose = Limit(other, nano_usd=None, tokens=1000)
    assert isinstance(await store.budgets.reserve([loose, tight], nano_usd=0, tokens=10, ttl_s=60), Refused)
    assert await store.budgets.counters([KEY, other]) == {}  # the whole transaction rolled back


async def test_a_reservation_nobody_settled_counts_in_full_after_its_expiry(store: Store):
    await store.budgets.reserve([Limit(KEY, nano_usd=None, tokens=100)], nano_usd=5, tokens=40, ttl_s=0)
    assert await store.budgets.sweep() == 1
    counter = await store.budgets.counter(KEY)
    assert (counter.used_tokens, counter.reserved_tokens, counter.used_nano_usd) == (40, 0, 5)


# ---- a person's daily cap, mid-conversation ----------------------------------------------


async def test_a_users_daily_cap_reached_mid_conversation_through_telegram(store, llm, tg, tmp_path) -> None:
    llm.responder = dollar_replies
    config = priced(
        tg_config(
            llm, tg, tmp_path, agent={"tools": ["clock"]}, budgets=USER_CAP, approvals={"admins": {"telegram": [ADMIN]}}
        )
    )
    async with running(store, config) as gateway:
        tg.private_message(PERSON, "first", user_id=PERSON)
        await settle(gateway, lambda: texts(tg, PERSON) == ["answer"])
        llm.tool_call("clock", {}, id="c1", usage=DOLLAR)  # the second turn's first call spends the rest
        tg.private_message(PERSON, "what time is it?", user_id=PERSON)
        await settle(gateway, lambda: len(texts(tg, PERSON)) == 2)
        assert texts(tg, PERSON)[-1] == REACHED
        assert len(llm.requests) == 2  # the clock ran; the call after it was never made
        run = (await store.runs.list())[0]
        assert (run.stage, run.end_reason) == ("FAILED", "budget")
        tg.private_message(PERSON, "/cost", user_id=PERSON)
        tg.private_message(FRIEND, "me?", user_id=FRIEND)  # another person's day is their own
        await settle(gateway, lambda: len(texts(tg, PERSON)) == 3 and bool(texts(tg, FRIEND)))
        assert "Daily budget for you: $2.00 of $2.00" in texts(tg, PERSON)[-1]
        assert texts(tg, FRIEND) == ["answer"]
        alerts = [t for t in texts(tg, ADMIN) if "telegram:43" in t]  # once per share, not at every refusal
        assert len(alerts) == 2 and "used 50%" in alerts[0] and "used 100%" in alerts[1]
    full, half = await store.audit.list_audit(kind="budget_alert", user="telegram:43")  # with each claim
    assert (half.action, half.actor, half.detail["share"]) == ("alert", "telegram:43", 0.5)
    assert half.detail["scope"] == "user"
    assert (full.action, full.detail["share"], full.detail["used_nano_usd"]) == ("alert", 1.0, 2 * 10**9)
    (clock,) = await store.audit.list_audit(tool="clock")
    assert (clock.actor, clock.action, clock.outcome) == ("telegram:43", "allowed", "done")


async def test_a_users_daily_cap_through_slack(store, llm, slack, tmp_path) -> None:
    llm.responder = dollar_replies
    config = priced(slack_config(llm, slack, tmp_path, agent=NO_TOOLS, budgets=USER_CAP))
    async with slack_running(store, config, slack) as side:
        for n in range(3):
            await side.dm(f"message {n}")
            await side.settle(lambda n=n: len(slack_texts(slack, "D1")) == n + 1)
        assert slack_texts(slack, "D1") == ["answer", "answer", REACHED]
        assert len(llm.requests) == 2


async def test_an_unpriced_model_under_a_usd_cap_is_not_called(store, llm, tg, tmp_path) -> None:
    config = tg_config(
        llm, tg, tmp_path, agent=NO_TOOLS, budgets={"caps": [{"scope": "global", "period": "month", "usd": 100}]}
    )
    async with running(store, config) as gateway:
        tg.private_message(PERSON, "hi", user_id=PERSON)
        await settle(gateway, lambda: bool(texts(tg, PERSON)))
        assert texts(tg, PERSON) == [
            "⚠️ The model test-model has no price in llm.prices, so the USD budget cannot be kept; "
            "the call was not made."
        ]
        assert not llm.requests


async def test_an_unpriced_model_is_allowed_when_configured(store, llm, tg, tmp_path) -> None:
    config = tg_config(
        llm,
        tg,
        tmp_path,
        agent=NO_TOOLS,
        budgets={"unpriced": "allow", "caps": [{"scope": "global", "period": "month", "usd": 100}]},
    )
    llm.reply("fine")
    async with running(store, config) as gateway:
        tg.private_message(PERSON, "hi", user_id=PERSON)
        await settle(gateway, lambda: bool(texts(tg, PERSON)))
        assert texts(tg, PERSON) == ["fine"]


async def test_retries_are_reserved_one_by_one_and_a_failed_attempt_costs_nothing(store, llm, tmp_path) -> None:
    config = make_config(
        llm.base_url,
        str(tmp_path / "ws"),
        llm={**PRICED, "max_retries": 2},
        agent=NO_TOOLS,
        budgets={"caps": [{"scope": "global", "period": "day", "tokens": 100_000}]},
    )
    llm.error(503)
    llm.reply("after a retry", usage={"prompt_tokens": 30, "completion_tokens": 5})
    async with running_gateway(store, config) as h:
        await h.say("hello")
        await h.idle()
        assert h.channel.messages() == ["after a retry"] and len(llm.requests) == 2
        assert all(r["max_tokens"] == 20 for r in llm.requests)
    (counter,) = await store.budgets.current({"day": period_key("day", datetime.now(UTC), ZoneInfo("UTC"))})
    assert (counter.used_tokens, counter.reserved_tokens) == (35, 0)


# ---- two instances racing at a cap -------------------------------------------------------


@pytest.fixture
async def second_store(store, db_kind):
    if db_kind != "postgres":
        pytest.skip("several instances share PostgreSQL")
    other = Store(store.db.url, pg_schema=store.db.pg_schema)
    yield other
    await other.close()


async def test_two_instances_racing_at_a_cap_never_spend_past_it(store, second_store, tmp_path):
    cap = 2_000
    async with FakeLLM(
        responder=lambda request: Reply("ok", usage={"prompt_tokens": 60, "completion_tokens": 40}), delay=0.005
    ) as llm:
        config = make_config(
            llm.base_url,
            str(tmp_path),
            llm={"max_tokens": 20},
            agent=NO_TOOLS,
            inbox={"max_concurrent_turns": 8},
            budgets={"caps": [{"scope": "global", "period": "day", "tokens": cap}]},
        )
        async with (
            running_gateway(store, config, FakeChannel(), instance_id="a") as a,
            running_gateway(second_store, config, FakeChannel(), instance_id="b") as b,
        ):
            threads = [ThreadKey("fake", f"chat{t}", "") for t in range(40)]
            await asyncio.gather(
                *[
                    (a if t % 2 else b).gateway.submit(
                        [InboundMessage(thread, ALICE if t % 3 else BOB, f"go {t}", f"fake:race:{t}")]
                    )
                    for t, thread in enumerate(threads)
                ]
            )
            deadline = asyncio.get_running_loop().time() + 120
            while len([r for r in await store.runs.list(limit=100) if r.finished_at is not None]) < 40:
                assert asyncio.get_running_loop().time() < deadline, "not every turn ended"
                await asyncio.sleep(0.05)
            await a.idle()
            await b.idle()
        runs = await store.runs.list(limit=100)
        (counter,) = await store.budgets.current({"day": period_key("day", datetime.now(UTC), ZoneInfo("UTC"))})
        assert counter.used_tokens <= cap and counter.reserved_tokens == 0
        assert counter.used_tokens == 100 * len(llm.requests)  # every call made was counted
        reasons = sorted({r.end_reason for r in runs})
        assert reasons == ["budget", "reply"]  # some turns answered, the rest stopped at the cap
        assert len(llm.requests) >= 5  # worst case 20 + prompt bound per call: several fit


# ---- scheduled runs ------------------------------------------------------------------------

CHAT = ThreadKey("telegram", "900", "")
JOB = {"name": "nightly", "kind": "cron", "cron": "0 3 * * *", "prompt": "Report.", "deliver_to": "telegram:900"}


async def fire(h):  # noqa: ANN001, ANN201
    schedule = await h.store.schedules.by_name("nightly")
    run = await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
    await h.idle()
    return schedule, run


def job_config(llm, tmp_path, tokens: int):  # noqa: ANN001, ANN201
    return make_config(
        llm.base_url,
        str(tmp_path / "ws"),
        llm={"max_tokens": 20},
        agent=NO_TOOLS,
        scheduler={"enabled": True, "jobs": [JOB]},
        budgets={"caps": [{"scope": "job", "period": "day", "tokens": tokens}]},
    )


async def test_a_job_cap_skips_the_next_scheduled_run(store, llm, tmp_path):
    llm.reply("Report one.", usage={"prompt_tokens": 250, "completion_tokens": 250})  # exactly the job's cap
    async with running_gateway(store, job_config(llm, tmp_path, 500), FakeChannel(name="telegram")) as h:
        schedule, first = await fire(h)
        await h.wait_for(lambda: bool(h.channel.messages(CHAT)))
        _, second = await fire(h)
        assert (
            second.status == "skipped"
            and second.error == "budget: Daily budget for this job reached (500 tokens); it resets at 00:00 UTC."
        )
        assert len(llm.requests) == 1 and second.session_id is None  # no session, no call
        await h.wait_for(lambda: len(h.channel.messages(CHAT)) == 2)
        assert (
            h.channel.messages(CHAT)[1]
            == "⏸ Job **nightly** skipped: Daily budget for this job reached (500 tokens); it resets at 00:00 UTC."
        )
        statuses = [r.status for r in await store.schedules.recent_runs(schedule.id)]
        assert sorted(statuses) == ["skipped", "success"]


async def test_a_job_run_stopped_at_its_cap_is_recorded_skipped(store, llm, tmp_path):
    llm.reply("Report one.", usage={"prompt_tokens": 200, "completion_tokens": 200})
    async with running_gateway(store, job_config(llm, tmp_path, 500), FakeChannel(name="telegram")) as h:
        schedule, _ = await fire(h)
        await h.wait_for(lambda: bool(h.channel.messages(CHAT)))
        await fire(h)  # 400 used: it starts, but its call's worst case does not fit
        await h.wait_for(lambda: len(h.channel.messages(CHAT)) == 2)
        latest = (await store.schedules.recent_runs(schedule.id))[0]
        assert latest.status == "skipped" and latest.error.startswith("budget: Daily budget for this job reached")
        assert len(llm.requests) == 1


async def test_gateway_budgets_lists_every_cap_and_its_use(store, llm, tmp_path):
    llm.reply("done", usage={"prompt_tokens": 90, "completion_tokens": 10})
    config = make_config(
        llm.base_url,
        str(tmp_path / "ws"),
        llm=PRICED,
        agent=NO_TOOLS,
        budgets={
            "caps": [
                {"scope": "user", "period": "day", "usd": 2},
                {"scope": "global", "period": "month", "tokens": 1000},
            ]
        },
    )
    async with running_gateway(store, config) as h:
        await h.say("hi")
        await h.idle()
    report = "\n".join(await budgets_report(store, config))
    assert "user / day" in report and "fake:100" in report and "$0.10 of $2.00" in report
    assert "global / month" in report and "100 tokens of 1,000 tokens" in report
