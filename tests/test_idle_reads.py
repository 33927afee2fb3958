"""An idle gateway costs nothing per known thread: its periodic reads (the dispatcher's poll,
maintenance, heartbeats and the instance count) look rows up by index, never walk every
thread's rows. Checked by SQLite's query plans of the statements an idle gateway runs."""

from __future__ import annotations

import asyncio

from fakes.channel import FakeChannel
from fakes.llm import FakeLLM, Reply
from harness import ALICE, make_config, running_gateway
from sqlalchemy import event

from gateway.events import InboundMessage, ThreadKey

# What grows with every thread that ever talked (its rows stay when it goes quiet).
PER_THREAD_TABLES = {"threads", "sessions", "messages", "runs", "run_events", "inbox", "outbox", "leases", "tool_calls"}


def full_scans(conn, statement: str, parameters) -> list[str]:  # noqa: ANN001
    plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
    return [row[-1] for row in plan if row[-1].startswith("SCAN ") and row[-1].split()[1] in PER_THREAD_TABLES]


async def test_an_idle_gateway_reads_no_table_of_per_thread_rows_from_end_to_end(sqlite_store, tmp_path):
    async with FakeLLM(responder=lambda request: Reply("hello")) as llm:
        # Heartbeats every 0.5 s, maintenance every 0.5 s: a few rounds of everything periodic.
        config = make_config(llm.base_url, str(tmp_path), inbox={"lease_ttl_s": 1.5}, outbox={"sweep_after_s": 0.5})
        channel = FakeChannel()
        async with running_gateway(sqlite_store, config, channel, instance_id="a") as harness:
            for n in range(3):  # threads with a history, all quiet again
                thread = ThreadKey("fake", f"chat{n}", "")
                await harness.gateway.submit([InboundMessage(thread, ALICE, "hi", f"fake:{n}")])
            while sum(1 for s in channel.shown if s.kind == "message") < 3:
                await asyncio.sleep(0.05)
            await harness.idle()
            seen: dict[str, object] = {}

            def record(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
                if statement.lstrip().upper().startswith(("SELECT", "UPDATE", "DELETE")):
                    seen.setdefault(statement, parameters)

            engines = (sqlite_store.db._sqlite.writer_engine, sqlite_store.db._sqlite.reader_engine)
            for engine in engines:
                event.listen(engine, "before_cursor_execute", record)
            try:
                await asyncio.sleep(2.5)  # idle
            finally:
                for engine in engines:
                    event.remove(engine, "before_cursor_execute", record)
    assert seen, "an idle gateway still polls, renews and maintains"
    with sqlite_store.db._sqlite.reader_engine.connect() as conn:
        plans = {statement: full_scans(conn, statement, parameters) for statement, parameters in seen.items()}
    scans = {statement: found for statement, found in plans.items() if found}
    assert scans == {}
