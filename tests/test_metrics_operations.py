"""/metrics of operations: cost, outbox retries, ambiguous sends, stuck and retrying rows, rate-limit
waits, lease takeovers, leader changes, scheduler firings and budget use, each moved by its event
through the real code paths."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from fakes.llm import Reply
from harness import make_config, running_gateway
from sqlalchemy import update
from test_metrics import StoreOnly, moved, sample, scrape, snapshot
from test_outbox_delivery import CHAT, ScriptedChannel, VirtualTime, outbox_for

from gateway.config import HttpConfig
from gateway.events import ChannelError, utcnow
from gateway.serving.http import HttpServer
from gateway.serving.status import StatusPages
from gateway.store.tables import leases, outbox

COST = ("gateway_llm_cost_usd_total", ("model", "test-model"))
RETRY_AFTER = ("gateway_outbox_retries_total", ("channel", "fake"), ("reason", "retry_after"))
BACKOFF = ("gateway_outbox_retries_total", ("channel", "fake"), ("reason", "backoff"))
RESENT = ("gateway_outbox_ambiguous_total", ("channel", "fake"), ("decision", "resent"))
GAVE_UP = ("gateway_outbox_ambiguous_total", ("channel", "fake"), ("decision", "gave_up"))
WAITS = ("gateway_rate_limit_waits_total", ("channel", "fake"))
WAIT_SECONDS = ("gateway_rate_limit_wait_seconds_total", ("channel", "fake"))
THREAD_TAKEOVERS = ("gateway_lease_takeovers_total", ("lease", "thread"))
LEADER_TAKEOVERS = ("gateway_lease_takeovers_total", ("lease", "leader"))
ACQUIRED = ("gateway_leader_changes_total", ("event", "acquired"))
LEADER = ("gateway_leader",)
FIRED_OK = ("gateway_scheduler_firings_total", ("status", "success"))
FIRED_RUNNING = ("gateway_scheduler_firings_total", ("status", "running"))
MISSED = ("gateway_scheduler_firings_total", ("status", "missed"))
SPENT = ("gateway_budget_spent_usd_total", ("scope", "global"))
USE = ("gateway_budget_use_ratio", ("scope", "global"), ("period", "day"))
PRICES = {"prices": {"test-model": {"input": 1000, "output": 1000}}, "max_tokens": 20}  # $0.001 a token
DOLLAR = {"prompt_tokens": 900, "completion_tokens": 100}


async def test_cost_and_budget_use_move_with_a_priced_call(store, llm, tmp_path):
    llm.responder = lambda request: Reply("priced", usage=DOLLAR)
    caps = {"caps": [{"scope": "global", "period": "day", "usd": 4}]}
    config = make_config(llm.base_url, str(tmp_path / "ws"), llm=PRICES, agent={"tools": []}, budgets=caps)
    before = snapshot(COST, SPENT)
    async with running_gateway(store, config) as h:
        await h.say("hi")
        await h.idle()
    delta = moved(before)
    assert delta[COST] == pytest.approx(1.0) and delta[SPENT] == pytest.approx(1.0)
    assert snapshot(USE)[USE] == pytest.approx(0.25)  # $1 of the $4 day


async def test_outbox_retries_ambiguous_sends_and_rate_limit_waits(sqlite_store):
    virtual = VirtualTime()
    failures = [
        ChannelError("flood", retry_after=30),
        ChannelError("HTTP 502"),
        ChannelError("timed out", ambiguous=True),
        ChannelError("timed out again", ambiguous=True),
    ]
    box = outbox_for(sqlite_store, ScriptedChannel(failures), time_source=virtual)
    before = snapshot(RETRY_AFTER, BACKOFF, RESENT, GAVE_UP, WAITS, WAIT_SECONDS)
    with pytest.raises(ChannelError):
        await box.send_text(CHAT, "hello", key="k1")
    delta = moved(before)
    assert (delta[RETRY_AFTER], delta[BACKOFF], delta[RESENT], delta[GAVE_UP]) == (1, 1, 1, 1)
    assert delta[WAITS] == 1 and delta[WAIT_SECONDS] == pytest.approx(30)  # the hold; backoff is no chat wait


async def test_outbox_gauges_in_the_one_scrape_query(store):
    server = HttpServer(StatusPages(StoreOnly(store), HttpConfig(host="127.0.0.1", port=0)))
    await server.start()
    try:
        text, empty_cost = await scrape(server)
        assert sample(text, "gateway_outbox_retrying") == 0 and sample(text, "gateway_outbox_stuck") == 0
        for key in ("retried", "stuck", "fresh"):
            await store.outbox.record(key, str(CHAT), "message", {"text": key})
        retried = await store.outbox.get("retried")
        await store.outbox.attempt_failed(retried.id, "HTTP 502", final=False, retry_at=None, uncertain=None)
        old = update(outbox).where(outbox.c.key == "stuck").values(created_at=utcnow() - timedelta(minutes=5))
        await store.db.write(lambda conn: conn.execute(old))
        text, cost = await scrape(server)
        assert sample(text, "gateway_outbox_retrying") == 1 and sample(text, "gateway_outbox_stuck") == 1
        assert cost == empty_cost == 1
    finally:
        await server.stop()


async def test_lease_takeovers_and_leader_changes(store, llm, tmp_path):
    llm.reply("taken over")
    expired = utcnow() - timedelta(seconds=30)
    await store.inbox.acquire("leader", "dead-instance", 5)
    await store.inbox.acquire("thread:fake:chat1:", "dead-instance", 5)
    await store.db.write(lambda conn: conn.execute(update(leases).values(expires_at=expired)))
    before = snapshot(THREAD_TAKEOVERS, LEADER_TAKEOVERS, ACQUIRED)
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("anyone?")
        await h.idle()
        await h.wait_for(lambda: snapshot(LEADER)[LEADER] == 1)
    assert moved(before) == {THREAD_TAKEOVERS: 1, LEADER_TAKEOVERS: 1, ACQUIRED: 1}
    assert snapshot(LEADER)[LEADER] == 0  # a stopped gateway leads nothing


async def test_scheduler_firings_by_status(store, llm, tmp_path):
    llm.reply("report")
    job = {"name": "nightly", "kind": "cron", "cron": "0 3 * * *", "prompt": "Report.", "deliver_to": "none"}
    config = make_config(llm.base_url, str(tmp_path / "ws"), scheduler={"enabled": True, "jobs": [job]})
    before = snapshot(FIRED_OK, FIRED_RUNNING, MISSED)
    async with running_gateway(store, config) as h:
        schedule = await store.schedules.by_name("nightly")
        await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
        await h.idle()
        await h.wait_for(lambda: moved(before)[FIRED_OK] == 1)
        await store.schedules.record_missed(schedule.id, [datetime(2026, 1, 1, 3, tzinfo=UTC)], error="down")
    assert moved(before) == {FIRED_OK: 1, FIRED_RUNNING: 1, MISSED: 1}
