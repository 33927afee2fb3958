"""/metrics: each counter moves when its event happens; a scrape costs the same queries whatever the inbox holds."""

from __future__ import annotations

from datetime import timedelta

import aiohttp
from harness import make_config, running_gateway
from sqlalchemy import update

from gateway.config import HttpConfig
from gateway.events import InboundMessage, Sender, ThreadKey
from gateway.serving.http import HttpServer
from gateway.serving.metrics import REGISTRY
from gateway.serving.status import StatusPages
from gateway.store import NewItem, Store
from gateway.store.tables import inbox

T1 = ThreadKey("fake", "chat1", "")


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def snapshot(*keys: tuple) -> dict[tuple, float]:
    return {key: value(key[0], **dict(key[1:])) for key in keys}


def moved(before: dict[tuple, float]) -> dict[tuple, float]:
    return {key: value(key[0], **dict(key[1:])) - was for key, was in before.items()}


INBOUND = ("gateway_inbound_events_total", ("channel", "fake"), ("kind", "message"))
BUTTONS = ("gateway_inbound_events_total", ("channel", "fake"), ("kind", "button"))
DUPLICATES = ("gateway_inbound_duplicates_total", ("channel", "fake"))
TURNS_OK = ("gateway_turns_total", ("stage", "SUCCESS"), ("reason", "reply"))
TURNS_FAILED = ("gateway_turns_total", ("stage", "FAILED"), ("reason", "error"))
TURN_SECONDS = ("gateway_turn_duration_seconds_count",)
FIRST_TOKEN = ("gateway_llm_first_token_seconds_count",)
LLM_TOTAL = ("gateway_llm_call_seconds_count",)
TOKENS_IN = ("gateway_llm_tokens_total", ("direction", "in"))
TOKENS_OUT = ("gateway_llm_tokens_total", ("direction", "out"))
RETRIES = ("gateway_llm_retries_total", ("kind", "retry"))
SENDS = ("gateway_outbox_sends_total", ("channel", "fake"))
TOOL_DONE = ("gateway_tool_calls_total", ("tool", "write_file"), ("outcome", "done"))
TOOL_REJECTED = ("gateway_tool_calls_total", ("tool", "write_file"), ("outcome", "rejected"))
REQUESTED = ("gateway_approvals_total", ("event", "requested"))
APPROVED = ("gateway_approvals_total", ("event", "approved"))
DENIED = ("gateway_approvals_total", ("event", "denied"))
EXPIRED = ("gateway_approvals_total", ("event", "expired"))
AUTO_DENIED = ("gateway_approvals_total", ("event", "auto_denied"))


async def test_a_reply_moves_intake_turn_llm_and_outbox_metrics(store, llm, tmp_path):
    llm.reply("hello there")
    before = snapshot(INBOUND, DUPLICATES, TURNS_OK, TURN_SECONDS, FIRST_TOKEN, LLM_TOTAL, TOKENS_IN, TOKENS_OUT,
                      SENDS)
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("hi", event_id="fake:once")
        await h.say("hi", event_id="fake:once")  # the platform redelivers
        await h.idle()
    delta = moved(before)
    assert delta[INBOUND] == 1 and delta[DUPLICATES] == 1
    assert delta[TURNS_OK] == 1 and delta[TURN_SECONDS] == 1
    assert delta[FIRST_TOKEN] == 1 and delta[LLM_TOTAL] == 1
    assert delta[TOKENS_IN] > 0 and delta[TOKENS_OUT] > 0
    assert delta[SENDS] >= 1


async def test_retries_and_failed_turns_are_counted(store, llm, tmp_path):
    llm.error(503)
    llm.reply("after one retry")
    before = snapshot(RETRIES, TURNS_OK)
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("hi")
        await h.idle()
    assert moved(before) == {RETRIES: 1, TURNS_OK: 1}

    for _ in range(4):
        llm.error(400, message="bad request")
    before = snapshot(TURNS_FAILED)
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("again")
        await h.idle()
    assert moved(before)[TURNS_FAILED] == 1


async def test_approvals_and_tool_calls_are_counted(store, llm, tmp_path):
    llm.tool_call("write_file", {"path": "a.txt", "content": "a"}, id="w1")
    llm.reply("Written.")
    llm.tool_call("write_file", {"path": "b.txt", "content": "b"}, id="w2")
    llm.reply("Not written.")
    before = snapshot(REQUESTED, APPROVED, DENIED, TOOL_DONE, TOOL_REJECTED, BUTTONS)
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("write a")
        await h.idle()
        await h.tap(h.token(0, "✅"))
        await h.idle()
        await h.say("write b")
        await h.idle()
        await h.tap(h.token(1, "❌"))
        await h.idle()
    assert moved(before) == {REQUESTED: 2, APPROVED: 1, DENIED: 1, TOOL_DONE: 1, TOOL_REJECTED: 1, BUTTONS: 2}


async def test_an_expired_approval_is_counted(store, llm, tmp_path):
    llm.tool_call("write_file", {"path": "c.txt", "content": "c"}, id="w3")
    llm.reply("Too late.")
    before = snapshot(EXPIRED)
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        await h.say("write c")
        await h.idle()
        (prompt,) = await store.prompts.pending(thread_key=str(T1))
        await h.gateway.prompts.expire(prompt)
        await h.idle()
    assert moved(before)[EXPIRED] == 1


async def test_an_auto_denied_call_is_counted(store, llm, tmp_path):
    llm.tool_call("write_file", {"path": "cron.txt", "content": "c"}, id="w4")
    llm.reply("Could not write.")
    before = snapshot(AUTO_DENIED, REQUESTED, TOOL_REJECTED)
    async with running_gateway(store, make_config(llm.base_url, str(tmp_path / "ws"))) as h:
        thread = ThreadKey("cron", "nightly", "1")
        await store.sessions.open(
            str(thread), source="cron", kind="cron", interactive=False, ephemeral=True, fresh=True
        )
        await h.gateway.submit([InboundMessage(thread, Sender("scheduler", "scheduler"), "write it", "job:1")])
        await h.idle()
    assert moved(before) == {AUTO_DENIED: 1, REQUESTED: 0, TOOL_REJECTED: 1}


async def scrape(server: HttpServer) -> tuple[str, int]:
    count = server.pages.gateway.store.db.count
    statements = count.statements
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{server.port}/metrics") as response:
            assert response.status == 200
            text = await response.text()
    return text, count.statements - statements


class StoreOnly:
    """The readiness of a gateway that has a store and nothing else (no channels, no MCP)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def channels_started(self) -> dict[str, bool]:
        return {}

    def mcp_summary(self) -> dict:
        return {}


def sample(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[-1])


async def test_a_scrape_costs_the_same_queries_for_an_empty_and_a_full_inbox(store):
    # No workers: what is added stays pending, as in an inbox that has fallen behind.
    server = HttpServer(StatusPages(StoreOnly(store), HttpConfig(host="127.0.0.1", port=0)))
    await server.start()
    try:
        text, empty_cost = await scrape(server)
        assert sample(text, "gateway_inbox_pending") == 0
        assert sample(text, "gateway_inbox_oldest_pending_age_seconds") == 0
        items = [NewItem(f"e{i}", f"fake:chat{i % 7}:", "message", {"text": "x"}) for i in range(200)]
        await store.inbox.add(items)
        text, full_cost = await scrape(server)
        assert sample(text, "gateway_inbox_pending") == 200
        assert sample(text, "gateway_inbox_oldest_pending_age_seconds") >= 0
        assert full_cost == empty_cost <= 1
    finally:
        await server.stop()


async def test_the_oldest_pending_age_follows_the_oldest_item(store):
    server = HttpServer(StatusPages(StoreOnly(store), HttpConfig(host="127.0.0.1", port=0)))
    await server.start()
    try:
        await store.inbox.add([NewItem("old", "fake:chat1:", "message", {"text": "x"})])
        await backdate(store, "old", timedelta(minutes=20))
        text, _ = await scrape(server)
        assert 20 * 60 <= sample(text, "gateway_inbox_oldest_pending_age_seconds") < 21 * 60
    finally:
        await server.stop()


async def backdate(store, event_id: str, by: timedelta) -> None:  # noqa: ANN001
    item = await store.inbox.get_by_event(event_id)
    statement = update(inbox).where(inbox.c.id == item.id).values(created_at=item.created_at - by)
    await store.db.write(lambda conn: conn.execute(statement))


