"""What a message costs the database must not grow with what a deployment accumulates: the
statements one turn sends are counted with a little and with a lot of history, memory, tools and
stored sessions, and must be the same (bench/growth.py measures the CPU and request sizes; these
catch the unbounded read, the scan per message, the query per entry coming back). On SQLite and
PostgreSQL. A session's memory section is rendered once, and rendered again as soon as an entry
it shows is forgotten, on any instance."""

from __future__ import annotations

import asyncio
from typing import Any

from fakes.channel import FakeChannel
from harness import make_config
from turn_driver import drive_turn, statements_per_turn

from gateway.app import Gateway
from gateway.config import Config
from gateway.events import ThreadKey
from gateway.llm import LLMClient
from gateway.memory.block import MemoryBook
from gateway.store import NewToolCall, SessionRepo
from gateway.tools.registry import ToolSpec

OWNER = "person:fake:1"
TURNS = 4


def config_for(model_server, tmp_path, **sections: Any) -> Config:  # noqa: ANN001
    return make_config(model_server.base_url, str(tmp_path / "ws"), memory={"max_entries": 5000}, **sections)


class Built:
    """A gateway built, not started: only the driven turns talk to the database."""

    def __init__(self, store, config: Config):  # noqa: ANN001
        self.client = LLMClient(config.llm)
        self.gateway = Gateway(config, channels={"fake": FakeChannel()}, serve_http=False, store=store,
                               llm=self.client)

    async def __aenter__(self) -> Gateway:
        return self.gateway

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()


async def seed_history(store, thread: ThreadKey, pairs: int) -> None:  # noqa: ANN001
    session = await store.sessions.open(str(thread), source="fake", started_by="1", private=True)

    def write(conn) -> None:  # noqa: ANN001
        for n in range(pairs):
            SessionRepo.append_in(conn, session.id, "user", f"Question {n}?", sender_id="1", sender_name="Ann")
            if n % 10 == 9:
                call = NewToolCall(f"seed_{n}", "clock", "{}", status="done", result="12:00")
                SessionRepo.append_in(conn, session.id, "assistant", "", calls=[call])
            else:
                SessionRepo.append_in(conn, session.id, "assistant", f"Answer {n}.")

    await store.db.write(write)


async def seed_memory(store, count: int) -> None:  # noqa: ANN001
    for n in range(count):
        await store.memory.save(OWNER, f"Fact {n}: locker {n} holds the spare key {n}.", created_by="fake:1",
                                source="words", max_entries=5000)


async def test_statements_per_message_do_not_grow_with_the_sessions_history(store, llm, tmp_path) -> None:
    counts = []
    for pairs in (3, 400):
        thread = ThreadKey("fake", f"history{pairs}", "")
        await seed_history(store, thread, pairs)
        async with Built(store, config_for(llm, tmp_path, llm={"context_window": 16384})) as gateway:
            counts.append(await statements_per_turn(gateway, thread, TURNS))
    assert counts[0] == counts[1], f"statements per message: {counts[0]} with 3 turns of history, {counts[1]} with 400"


async def test_statements_per_message_do_not_grow_with_the_persons_memory(store, llm, tmp_path) -> None:
    counts = []
    for size, thread in ((2, ThreadKey("fake", "1", "")), (300, ThreadKey("fake", "1", "later"))):
        await seed_memory(store, size - (2 if size > 2 else 0))  # 2, then 300 in all
        async with Built(store, config_for(llm, tmp_path)) as gateway:
            counts.append(await statements_per_turn(gateway, thread, TURNS))
    assert counts[0] == counts[1], f"statements per message: {counts[0]} with 2 memory entries, {counts[1]} with 300"


async def test_statements_per_message_do_not_grow_with_the_tools_offered(store, llm, tmp_path) -> None:
    async def probe(ctx, args):  # noqa: ANN001, ANN202
        return "fine"

    counts = []
    for extra in (0, 200):
        async with Built(store, config_for(llm, tmp_path)) as gateway:
            for n in range(extra):
                gateway.services.registry.register(ToolSpec(
                    f"mcp__many__probe_{n:03d}", f"Check subsystem {n}.",
                    {"type": "object", "properties": {"target": {"type": "string"}}, "required": ["target"]},
                    probe, classes=frozenset({"mcp"}),
                ))
            counts.append(await statements_per_turn(gateway, ThreadKey("fake", f"tools{extra}", ""), TURNS))
    assert counts[0] == counts[1], f"statements per message: {counts[0]} with the built-ins, {counts[1]} with 200 more"


async def test_statements_per_message_do_not_grow_with_stored_sessions_and_runs(store, llm, tmp_path) -> None:
    counts = []
    async with Built(store, config_for(llm, tmp_path)) as gateway:
        counts.append(await statements_per_turn(gateway, ThreadKey("fake", "before", ""), TURNS))
        for n in range(300):  # other people's sessions, each with a finished turn
            await drive_turn(gateway, ThreadKey("fake", f"other{n}", ""), "hello", person=str(1000 + n))
        counts.append(await statements_per_turn(gateway, ThreadKey("fake", "after", ""), TURNS))
    assert counts[0] == counts[1], f"statements per message: {counts[0]} on an empty database, {counts[1]} after 300"


async def test_statements_per_message_do_not_grow_with_threads_in_flight(store, llm, tmp_path) -> None:
    # More sessions at once than the context builder once kept: each build was cold again and
    # read the whole history (two more statements, and CPU that grew with the history).
    async def per_turn(gateway: Gateway, threads: int) -> float:
        keys = [ThreadKey("fake", f"t{threads}-{n}", "") for n in range(threads)]
        for key in keys:
            await seed_history(store, key, 20)
        await asyncio.gather(*(drive_turn(gateway, key, "hello") for key in keys))
        before = gateway.store.db.count.statements
        await asyncio.gather(*(drive_turn(gateway, key, "and now?") for key in keys))
        return (gateway.store.db.count.statements - before) / threads

    async with Built(store, config_for(llm, tmp_path, inbox={"max_concurrent_turns": 200})) as gateway:
        few, many = await per_turn(gateway, 4), await per_turn(gateway, 80)
    # (on PostgreSQL a write retried after a conflict between concurrent turns adds a fraction)
    assert many - few < 0.5, f"statements per message: {few} with 4 threads in flight, {many} with 80"


async def test_a_forgotten_entry_leaves_a_kept_memory_section_at_once_even_from_another_instance(
    store, llm, tmp_path, monkeypatch
) -> None:
    await seed_memory(store, 3)
    session = await store.sessions.open("fake:1:", source="fake", started_by="1", private=True)
    config = config_for(llm, tmp_path)
    here, there = MemoryBook(store, config.memory), MemoryBook(store, config.memory)
    entry = next(e for e in await store.memory.ranked([OWNER]) if "Fact 1:" in e.text)
    reads = []
    ranked = store.memory.ranked

    async def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        reads.append(args)
        return await ranked(*args, **kwargs)

    monkeypatch.setattr(store.memory, "ranked", counted)
    before = await here.block(_scope(), session)
    assert "Fact 1: locker 1" in before
    for _ in range(3):  # kept: the same text, and the entries are not read again (a read grew with them)
        assert await here.block(_scope(), session) == before
    assert len(reads) == 1
    await store.memory.forget(OWNER, [entry.id])  # on another instance: `there` knows nothing of it
    after = await here.block(_scope(), session)
    assert len(reads) == 2  # one it showed is gone: rendered again
    assert "Fact 1: locker 1" not in after and "Fact 0: locker 0" in after and "Fact 2: locker 2" in after
    assert after == await there.block(_scope(), session)


def _scope():  # noqa: ANN202
    from gateway.tools.registry import MemoryScope

    return MemoryScope(owner=OWNER, reads=(OWNER,))

