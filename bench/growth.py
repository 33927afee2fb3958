"""Cost as the work grows: gateway CPU, database statements and request size per message, as
each of what a real deployment accumulates grows on its own (issue 45).

Run by hand:  .venv/bin/python bench/growth.py [--db sqlite postgres] [--turns 20] [--quick]
              [--only history,memory,tools,rows,threads]

Each case is a fresh database and gateway, one thing grown, then `--turns` measured turns (after
two that warm the caches) driven as the inbox drives them (the message consumed, the run
started, `Turn.run`), against the fake LLM in a child process at 0 ms (its CPU is not counted):

- history: the session's earlier turns (1, 50, 200, 1,000; a turn is a question and an answer,
  every tenth with a tool call) under a 16k window, so compaction does its job;
- memory: the person's memory entries (0, 100, 10,000; `memory.max_entries` raised to allow them);
- tools: the tools offered (13 built in; then 50 and 200 with a stdio MCP server's read-only
  tools, `tests/mcp_server/server.py --many`), with a 128k window;
- rows: other sessions and their runs already stored (0, 100 k, 1 M of each);
- threads: turns in flight at once (10, 1,000), each on its own session.

Figures per case: CPU ms per message (p50 over the turns; for threads, the batch's CPU over its
turns), statements per message (all the store sent, from its statement counter), request bytes
(the last request's body). The goal: at most 1.25x the smallest case's CPU at every point, no
statement count that grows, request size bounded by the window. PostgreSQL runs when
GATEWAY_TEST_POSTGRES_URL is set.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# support comes first: importing it puts the project and tests/ on sys.path.
from support import LLMProcess, bench_store, database_kinds

# isort: split
from fakes.channel import FakeChannel
from turn_driver import drive_turn
from turn_overhead import seed

from gateway.app import Gateway
from gateway.config import Config
from gateway.events import ThreadKey
from gateway.llm import LLMClient
from gateway.store import Store

ROOT = Path(__file__).resolve().parents[1]
CPU_GOAL = 1.25
PERSON = "1"
DIMENSIONS = {
    "history": [1, 50, 200, 1000],
    "memory": [0, 100, 10_000],
    "tools": [13, 50, 200],
    "rows": [0, 100_000, 1_000_000],
    "threads": [10, 1000],
}


@dataclass(frozen=True)
class Point:
    dimension: str
    size: int
    cpu_ms: float
    statements: float
    request_bytes: int


def progress(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


def bench_config(llm_url: str, workspace: str, **sections: Any) -> Config:
    data: dict[str, Any] = {
        "llm": {"base_url": llm_url, "model": "bench-model", "max_retries": 0, "context_window": 16384},
        "agent": {"workspace": workspace, "system_prompt": "You are a benchmark agent."},
        "scheduler": {"enabled": False},
        "access": {"dm_policy": "open", "group_policy": "open"},  # the benchmark talks as people nobody listed
        "memory": {"max_entries": 20_000},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return Config.model_validate(data)


class Bench:
    """One gateway on one store, driving turns as the inbox does."""

    def __init__(self, gateway: Gateway, llm: LLMProcess):
        self.gateway = gateway
        self.store: Store = gateway.store
        self.llm = llm

    async def turn(self, thread: ThreadKey, text: str) -> None:
        await drive_turn(self.gateway, thread, text, person=PERSON)

    async def measure(self, dimension: str, size: int, thread: ThreadKey, turns: int) -> Point:
        for n in range(2):  # warm: the builder's cache, the model's window, compaction if due
            await self.turn(thread, f"Warming up {n}: how is the project going?")
        cpu: list[float] = []
        statements_before = self.store.db.count.statements
        await self.llm.request_sizes()
        for n in range(turns):
            started = time.process_time()
            await self.turn(thread, f"Question {n}: how is the project going today?")
            cpu.append(time.process_time() - started)
        statements = (self.store.db.count.statements - statements_before) / turns
        sizes = await self.llm.request_sizes()
        return Point(dimension, size, statistics.median(cpu) * 1000, statements, sizes[-1] if sizes else 0)

    async def concurrent(self, size: int, turns_each: int) -> Point:
        """`size` threads with a turn in flight at once, `turns_each` rounds of them."""
        threads = [ThreadKey("bench", f"chat{n}", "") for n in range(size)]
        await asyncio.gather(*(self.turn(t, "Warming up: hello") for t in threads))
        statements_before = self.store.db.count.statements
        await self.llm.request_sizes()
        started = time.process_time()
        for n in range(turns_each):
            await asyncio.gather(*(self.turn(t, f"Question {n}: how is it going?") for t in threads))
        count = size * turns_each
        cpu = (time.process_time() - started) / count
        sizes = await self.llm.request_sizes()
        return Point("threads", size, cpu * 1000, (self.store.db.count.statements - statements_before) / count,
                     sizes[-1] if sizes else 0)


async def with_gateway(
    db: str, directory: Path, server: LLMProcess, work: Callable[[Bench], Awaitable[Point]], **sections: Any
) -> Point:
    async with bench_store(db, directory) as store:
        workspace = directory / f"ws-{time.monotonic_ns()}"
        workspace.mkdir(parents=True)
        config = bench_config(server.base_url, str(workspace), **sections)
        client = LLMClient(config.llm)
        gateway = Gateway(config, channels={"bench": FakeChannel(name="bench")}, serve_http=False, store=store,
                          llm=client)
        mcp = gateway.mcp if config.mcp.servers else None
        try:
            if mcp is not None:
                await mcp.start()
                await wait_for_tools(gateway, sum(1 for _ in config.mcp.servers))
            return await work(Bench(gateway, server))
        finally:
            if mcp is not None:
                await mcp.stop()
            await client.aclose()


async def wait_for_tools(gateway: Gateway, servers: int) -> None:
    for _ in range(600):
        if sum(1 for state in gateway.mcp.states.values() if state.status == "running") >= servers:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("the MCP server did not start")


# ---- growing one thing ---------------------------------------------------------------------------


async def history_case(db: str, directory: Path, llm: LLMProcess, size: int, turns: int) -> Point:
    async def work(bench: Bench) -> Point:
        thread = ThreadKey("bench", "history", "")
        session = await bench.store.sessions.open(str(thread), source="bench", started_by=PERSON, private=True)
        await seed(bench.store, session, size * 2)
        await analyze(bench.store)
        return await bench.measure("history", size, thread, turns)

    return await with_gateway(db, directory, llm, work)


async def memory_case(db: str, directory: Path, llm: LLMProcess, size: int, turns: int) -> Point:
    async def work(bench: Bench) -> Point:
        owner = f"person:bench:{PERSON}"
        await seed_rows(bench.store, "memories", size, lambda n: {
            "owner": owner, "text": f"Fact {n}: the project's code name number {n} is Falcon-{n}.",
            "topic": "project", "created_by": f"bench:{PERSON}", "uses": n % 7, "source": "words",
        })
        await analyze(bench.store)
        return await bench.measure("memory", size, ThreadKey("bench", PERSON, ""), turns)

    return await with_gateway(db, directory, llm, work)


async def tools_case(db: str, directory: Path, llm: LLMProcess, size: int, turns: int) -> Point:
    builtin = 13
    sections: dict[str, Any] = {"llm": {"context_window": 131072}}
    if size > builtin:
        server = {"command": sys.executable, "args": [str(ROOT / "tests/mcp_server/server.py"), "--many",
                                                       str(size - builtin - 10), "--state", str(directory / "mcp")]}
        sections["mcp"] = {"servers": {"bench": server}}

    async def work(bench: Bench) -> Point:
        progress(f"{len(bench.gateway.services.registry)} tools registered")
        return await bench.measure("tools", size, ThreadKey("bench", "tools", ""), turns)

    return await with_gateway(db, directory, llm, work, **sections)


async def rows_case(db: str, directory: Path, llm: LLMProcess, size: int, turns: int) -> Point:
    async def work(bench: Bench) -> Point:
        await seed_rows(bench.store, "sessions", size, lambda n: {
            "thread_key": f"bench:other{n}:", "kind": "interactive", "source": "bench", "started_by": "9",
        })
        await seed_rows(bench.store, "runs", size, lambda n: {
            "session_id": n + 1, "thread_key": f"bench:other{n}:", "stage": "SUCCESS", "model": "bench-model",
        })
        await analyze(bench.store)
        return await bench.measure("rows", size, ThreadKey("bench", "rows", ""), turns)

    return await with_gateway(db, directory, llm, work)


async def threads_case(db: str, directory: Path, llm: LLMProcess, size: int, turns: int) -> Point:
    async def work(bench: Bench) -> Point:
        return await bench.concurrent(size, max(1, turns * 10 // size) if size > 10 else turns)

    return await with_gateway(db, directory, llm, work, inbox={"max_concurrent_turns": 2000})


CASES = {"history": history_case, "memory": memory_case, "tools": tools_case, "rows": rows_case,
         "threads": threads_case}


# ---- seeding -------------------------------------------------------------------------------------


async def seed_rows(store: Store, table_name: str, count: int, row: Callable[[int], dict[str, Any]]) -> None:
    """`count` rows of `table_name`, filled with the table's defaults, in batches."""
    from gateway.store.tables import metadata

    table = metadata.tables[table_name]
    batch = 5000
    started = time.perf_counter()
    for start in range(0, count, batch):
        rows = [_complete(table, row(n)) for n in range(start, min(start + batch, count))]
        await store.db.write(lambda conn, rows=rows: conn.execute(table.insert(), rows))
    if count:
        progress(f"seeded {count:,} {table_name} in {time.perf_counter() - started:.1f}s")


def _complete(table: Any, values: dict[str, Any]) -> dict[str, Any]:
    from gateway.events import utcnow

    filled = dict(values)
    for column in table.columns:
        if column.name in filled or column.primary_key:
            continue
        if column.default is not None and callable(getattr(column.default, "arg", None)):
            filled[column.name] = column.default.arg(None)
        elif column.default is not None:
            filled[column.name] = column.default.arg
        elif not column.nullable and column.server_default is None:
            filled[column.name] = utcnow() if column.name.endswith("_at") else 0
    return filled


async def analyze(store: Store) -> None:
    """As autovacuum (PostgreSQL) or an operator's ANALYZE would after such growth: plans see the rows."""
    await store.db.write(lambda conn: conn.exec_driver_sql("ANALYZE"))


# ---- report --------------------------------------------------------------------------------------


def print_table(db: str, points: list[Point]) -> None:
    print()
    print(f"Growth, {db}: per message, against the smallest case of each dimension (goal: CPU <= {CPU_GOAL}x)")
    print(f"{'dimension':<10}{'size':>10}{'cpu ms':>9}{'x':>7}{'stmts':>8}{'request B':>11}  verdict")
    for dimension in DIMENSIONS:
        rows = [p for p in points if p.dimension == dimension]
        if not rows:
            continue
        base = rows[0]
        for before, point in zip([None, *rows], rows, strict=False):
            ratio = point.cpu_ms / base.cpu_ms if base.cpu_ms else float("nan")
            # growth from one non-empty size to the next (an empty memory skips a read it then needs)
            grows = before is not None and before.size > 0 and point.statements > before.statements + 0.5
            verdict = "ok" if ratio <= CPU_GOAL and not grows else "GROWS" if grows else "MISSED"
            if point is base:
                verdict = "base"
            print(f"{dimension:<10}{point.size:>10,}{point.cpu_ms:>9.2f}{ratio:>7.2f}{point.statements:>8.1f}"
                  f"{point.request_bytes:>11,}  {verdict}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    parser.add_argument("--turns", type=int, default=20, help="measured turns per case (default 20)")
    parser.add_argument("--quick", action="store_true", help="5 turns per case, the largest sizes left out")
    parser.add_argument("--only", default=",".join(DIMENSIONS), help="dimensions, comma-separated")
    args = parser.parse_args()
    turns = 5 if args.quick else args.turns
    logging.basicConfig(level=logging.WARNING)
    wanted = [d.strip() for d in args.only.split(",") if d.strip()]
    with tempfile.TemporaryDirectory(prefix="bench-growth-") as tmp:
        async with LLMProcess() as llm:
            for db in database_kinds(args.db):
                points: list[Point] = []
                for dimension in wanted:
                    sizes = DIMENSIONS[dimension][:-1] if args.quick else DIMENSIONS[dimension]
                    for size in sizes:
                        points.append(await CASES[dimension](db, Path(tmp), llm, size, turns))
                        progress(f"{db}: {dimension} {size:,} done")
                print_table(db, points)


if __name__ == "__main__":
    asyncio.run(main())
