"""Context build time and prompt-prefix stability (issue 3). Not part of the test suite.

    .venv/bin/python bench/context_build.py                 # SQLite in a temporary directory
    .venv/bin/python bench/context_build.py --sizes 1000 10000 --turns 200
    .venv/bin/python bench/context_build.py --database postgresql+asyncpg://postgres@127.0.0.1:5432/test

Prints, per session size (mixed tool output): the first (cold) build, and the p50/p95 of a
round's build once the session is cached (a row appended, then a build), unbudgeted and with a
128k window. Then the prefix-stability rate of a 200-turn tool-heavy session: the share of turns
whose rendered prefix (all but the dynamic tail) starts with the previous turn's. Goals: <= 50 ms
per round at 10,000 messages on SQLite; >= 95 % of turns prefix-stable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from gateway.config import AgentConfig, ContextConfig, LLMConfig
from gateway.context import ContextBuilder
from gateway.store import NewToolCall, SessionRepo, Store

TOOLS = [("read_file", "head"), ("shell", "tail"), ("web_fetch", "head"), ("run_tests", "both")]


async def summarise(messages: list[dict], max_tokens: int) -> str:
    return "Summary of the earlier work: " + "decisions and facts. " * min(max_tokens // 8, 200)


def result_text(rng: random.Random) -> str:
    size = rng.choice([80, 300, 1_500, 6_000, 20_000])
    return "".join(rng.choice("abcdefghij klmnop\n") for _ in range(size))


def append_turn(conn, session_id: int, n: int, rng: random.Random) -> int:  # noqa: ANN001
    first = SessionRepo.append_in(conn, session_id, "user", f"request {n}: look into item {n}")
    for k in range(rng.choice([1, 1, 2])):
        name, _ = rng.choice(TOOLS)
        call = NewToolCall(f"call_{n}_{k}", name, json.dumps({"n": n}), "done", result_text(rng))
        SessionRepo.append_in(conn, session_id, "assistant", "", calls=[call])
    SessionRepo.append_in(conn, session_id, "assistant", f"answer {n}: item {n} is fine")
    return first.seq


async def populate(store: Store, messages: int, rng: random.Random) -> tuple[object, int]:
    session = await store.sessions.open(f"bench:{messages}:{rng.random()}", source="console")

    def work(conn) -> int:  # noqa: ANN001
        n = first = 0
        while n * 3.3 < messages:
            first = append_turn(conn, session.id, n, rng)
            n += 1
        return first

    return session, await store.db.write(work)


def make_builder(store: Store, window: int) -> ContextBuilder:
    llm = LLMConfig(model="bench", context_window=window)
    return ContextBuilder(store, ContextConfig(), llm, AgentConfig(), summarise=summarise,
                          tool_lod={name: lod for name, lod in TOOLS})


async def build(builder: ContextBuilder, session, turn_seq: int):  # noqa: ANN001
    return await builder.build(
        session, system_prompt="You are a benchmark.", turn_started_seq=turn_seq, notes={"goal": "measure"},
        now=datetime.now(UTC), timezone="UTC", workspace="/tmp", model="bench",
    )


async def time_builds(store: Store, session, first: int, window: int, rounds: int) -> tuple[float, list[float]]:  # noqa: ANN001
    builder = make_builder(store, window)
    started = time.perf_counter()
    built = await build(builder, session, first)
    cold = (time.perf_counter() - started) * 1000
    while built.folded:  # let budget folds settle (at most max_folds_per_build per build)
        built = await build(builder, session, first)
    samples = []
    for i in range(rounds):
        await store.sessions.append(session.id, "assistant", f"round {i}")
        started = time.perf_counter()
        await build(builder, session, first)
        samples.append((time.perf_counter() - started) * 1000)
    return cold, samples


async def bench_sizes(store: Store, sizes: list[int], rounds: int) -> None:
    rng = random.Random(7)
    print(f"{'messages':>9} {'window':>8} {'cold ms':>9} {'p50 ms':>8} {'p95 ms':>8}")
    for size in sizes:
        session, first = await populate(store, size, rng)
        for window in (0, 128_000):
            cold, samples = await time_builds(store, session, first, window, rounds)
            p95 = sorted(samples)[int(len(samples) * 0.95) - 1]
            label = "none" if window == 0 else f"{window // 1000}k"
            print(f"{size:>9} {label:>8} {cold:>9.1f} {statistics.median(samples):>8.1f} {p95:>8.1f}")


def starts_with(messages: list[dict], previous: list[dict]) -> bool:
    """`messages` begin with what `previous` sent up to its dynamic tail, which is joined to the
    last user message after a blank line: the previous request is a token prefix up to there."""
    last = previous[-1]
    head, joined, _ = str(last["content"]).rpartition("\n\n[context] ")
    untailed = {**last, "content": head} if joined else None
    before = len(previous) - 1
    same_start = json.dumps(messages[:before]) == json.dumps(previous[:before])
    return same_start and (untailed is None or (len(messages) > before and messages[before] == untailed))


async def bench_prefix(store: Store, turns: int, window: int) -> None:
    rng = random.Random(11)
    session = await store.sessions.open(f"bench:prefix:{window}", source="console")
    builder = make_builder(store, window)
    previous: list[dict] | None = None
    stable = folds = 0
    for n in range(turns):
        first = await store.sessions.append(session.id, "user", f"request {n}: look into item {n}")
        built = await build(builder, session, first.seq)
        folds += len(built.compactions)
        if previous is not None and starts_with(built.messages, previous):
            stable += 1
        previous = built.messages
        for k in range(rng.choice([1, 2, 3])):  # rounds inside the turn build too, as the turn loop does
            name, _ = rng.choice(TOOLS)
            call = NewToolCall(f"call_{n}_{k}", name, json.dumps({"n": n}), "done", result_text(rng))
            await store.sessions.append(session.id, "assistant", "", calls=[call])
            folds += len((await build(builder, session, first.seq)).compactions)
        await store.sessions.append(session.id, "assistant", f"answer {n}: item {n} is fine")
    rate = 100 * stable / max(1, turns - 1)
    print(f"prefix-stable turns: {stable}/{turns - 1} = {rate:.1f} % ({window // 1000}k window, {folds} folds)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", help="SQLAlchemy URL (default: SQLite in a temporary directory)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--turns", type=int, default=200)
    args = parser.parse_args()
    logging.getLogger("gateway.context").setLevel(logging.ERROR)  # "over the target" while folds settle
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(args.database or f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}")
        await store.migrate()
        try:
            await bench_sizes(store, args.sizes, args.rounds)
            for window in (128_000, 32_000):
                await bench_prefix(store, args.turns, window)
        finally:
            await store.close()


if __name__ == "__main__":
    asyncio.run(main())
