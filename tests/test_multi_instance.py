"""Two gateway instances on one PostgreSQL database: every message answered exactly once,
per-thread order kept, and a tap taken by one instance resumes a turn parked by the other."""

from __future__ import annotations

import asyncio

import pytest
from fakes.channel import FakeChannel
from fakes.llm import FakeLLM, Reply, user_texts
from harness import ALICE, make_config, running_gateway
from helpers import session_file

from gateway.events import ButtonPress, InboundMessage, ThreadKey
from gateway.store import Store


def echo(request: dict) -> Reply:
    users = user_texts(request)
    return Reply(f"echo: {users[-1]}")


@pytest.fixture
async def second_store(store, db_kind):
    if db_kind != "postgres":
        pytest.skip("several instances share PostgreSQL")
    other = Store(store.db.url, pg_schema=store.db.pg_schema)
    yield other
    await other.close()


async def test_two_instances_answer_200_messages_over_20_threads_exactly_once(store, second_store, tmp_path):
    shown: list = []
    async with FakeLLM(responder=echo) as llm:
        config = make_config(llm.base_url, str(tmp_path), inbox={"busy_mode": "queue", "max_concurrent_turns": 4})
        async with running_gateway(store, config, FakeChannel(shown=shown), instance_id="a") as a, \
                running_gateway(second_store, config, FakeChannel(shown=shown), instance_id="b") as b:
            threads = [ThreadKey("fake", f"chat{t}", "") for t in range(20)]
            for i in range(10):
                for t, thread in enumerate(threads):
                    gateway = (a if (t + i) % 2 == 0 else b).gateway
                    await gateway.submit([InboundMessage(thread, ALICE, f"t{t} m{i}", f"fake:{t}:{i}")])
            deadline = asyncio.get_running_loop().time() + 120
            while sum(1 for s in shown if s.kind == "message") < 200:
                assert asyncio.get_running_loop().time() < deadline, "not every message was answered"
                await asyncio.sleep(0.05)
            await a.idle()
            await b.idle()
    replies = [s for s in shown if s.kind == "message"]
    assert len(replies) == 200  # nothing answered twice
    for t, thread in enumerate(threads):
        assert [s.text for s in replies if s.thread == thread] == [f"echo: t{t} m{i}" for i in range(10)]
    runs = await store.runs.list(limit=1000)
    assert len(runs) == 200 and all(r.stage == "SUCCESS" for r in runs)


async def test_a_tap_on_one_instance_resumes_a_turn_parked_by_the_other(store, second_store, tmp_path):
    async with FakeLLM() as llm:
        llm.tool_call("write_file", {"path": "shared.txt", "content": "ok"}, id="w1")
        llm.reply("written")
        config = make_config(llm.base_url, str(tmp_path / "ws"))
        thread = ThreadKey("fake", "chat1", "")
        async with running_gateway(store, config, instance_id="a") as a:
            await a.say("write it")
            await a.idle()
            token = a.token(0, "✅")
            async with running_gateway(second_store, config, instance_id="b") as b:
                await a.gateway.stop()  # the instance that parked the turn goes away
                await b.gateway.submit([ButtonPress(thread, ALICE, token, "fake:tap:1")])
                await b.idle()
                assert session_file(tmp_path / "ws", "shared.txt").exists()
                assert b.channel.messages() == ["written"]


async def test_work_stored_by_another_instance_wakes_this_one_at_once(store, second_store, tmp_path):
    """LISTEN/NOTIFY: with a 30 s poll, only the notification can make this quick."""
    from gateway.inbox.inbox import event_item

    async with FakeLLM(responder=echo) as llm:
        config = make_config(llm.base_url, str(tmp_path), inbox={"poll_interval_s": 30})
        async with running_gateway(store, config) as h:
            await asyncio.sleep(1.0)  # its dispatcher now waits for its next poll
            thread = ThreadKey("fake", "chat1", "")
            event = InboundMessage(thread, ALICE, "from the other instance", "fake:other:1", message_id="5")
            await second_store.inbox.add([event_item(event)])  # as another instance's submit does
            await h.wait_for(lambda: h.channel.messages() == ["echo: from the other instance"], timeout=10)


class CountingChannel(FakeChannel):
    """Records how many instances the core says share this channel's platform limits."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.shares: list[int] = []

    def share_rate_limits(self, instances: int) -> None:
        self.shares.append(instances)


async def test_instances_sharing_a_bot_learn_at_once_how_many_they_are_and_when_one_goes(store, second_store, tmp_path):
    # A beat every 40 s (a third of the lease): each change is told by a notification, not a beat.
    async def until(condition, what: str) -> None:
        deadline = asyncio.get_running_loop().time() + 20
        while not condition():
            assert asyncio.get_running_loop().time() < deadline, what
            await asyncio.sleep(0.05)

    async with FakeLLM(responder=echo) as llm:
        config = make_config(llm.base_url, str(tmp_path), inbox={"lease_ttl_s": 120})
        first, second = CountingChannel(), CountingChannel()
        async with running_gateway(store, config, first, instance_id="a"):
            await until(lambda: first.shares == [1], "a lone instance takes the whole budget")
            async with running_gateway(second_store, config, second, instance_id="b"):
                await until(lambda: second.shares == [2], "the second counts the first")
                await until(lambda: first.shares == [1, 2], "the first learns of the second at once")
            await until(lambda: first.shares == [1, 2, 1], "the stopped one gives its share back at once")
