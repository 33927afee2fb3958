"""Gateway-added time per LLM round, and the cost of building a long session's context.

Run by hand:  .venv/bin/python bench/turn_overhead.py [--rounds 40] [--quick] [--db sqlite postgres]

A turn is driven the way the inbox drives one (consume the message and start the run, run `Turn`), against the
fake LLM at 0 ms in a child process, on sessions seeded with 10, 1,000 and 10,000 messages.
Overhead per round = (turn wall time - time inside the fake LLM server - time inside tools)
/ rounds; "text" is a one-round reply, "tool" a two-round turn (`clock`, then a reply).
Separately, `ContextBuilder.build` for a 10,000-message session: cold (a new builder, as after
a restart) and warm (the builder's cache is current, as on every later round).
PostgreSQL runs when GATEWAY_TEST_POSTGRES_URL is set.
Goals: p50 <= 5 ms per round on SQLite at 1,000 messages; context build <= 50 ms at 10,000.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

# support comes first: importing it puts the project and tests/ on sys.path.
from support import TOOL_TRIGGER, LLMProcess, bench_store, database_kinds, ms, percentile

# isort: split
from fakes.channel import FakeChannel

from gateway.agent.messages import TurnRequest
from gateway.agent.turn import Turn
from gateway.app import Gateway
from gateway.config import Config
from gateway.events import ThreadKey
from gateway.llm import LLMClient
from gateway.store import NewItem, NewToolCall, SessionRecord, SessionRepo, Store

ROUND_GOAL_MS = 5.0
BUILD_GOAL_MS = 50.0
SEED_BATCH = 500
THREAD = ThreadKey("bench", "chat", "")


@dataclass(frozen=True)
class Case:
    db: str
    history: int
    kind: str  # text | tool
    per_round: list[float]  # seconds of gateway-added time per round, one value per turn
    cpu: list[float]  # CPU seconds of this process (all its threads) per round
    server: list[float]  # seconds inside the LLM server per turn
    cold: float  # per-round overhead of the first turn on the session (cache empty)


def progress(text: str) -> None:
    print(f"  .. {text}", file=sys.stderr, flush=True)


def bench_config(llm_url: str, workspace: str) -> Config:
    return Config.model_validate({
        "llm": {"base_url": llm_url, "model": "bench-model", "max_retries": 0},
        "agent": {"workspace": workspace, "system_prompt": "You are a benchmark agent.", "tools": ["clock"]},
        "scheduler": {"enabled": False},
        "access": {"dm_policy": "open", "group_policy": "open"},  # the benchmark talks as people nobody listed
    })


async def seed(store: Store, session: SessionRecord, count: int) -> None:
    """`count` history rows: user/assistant text, with a finished clock call every tenth pair."""

    def batch(conn, start: int, end: int) -> None:  # noqa: ANN001
        for n in range(start, end):
            if n % 2 == 0:
                SessionRepo.append_in(
                    conn,
                    session.id,
                    "user",
                    f"Message {n}: how is the project going today?",
                    sender_id="1",
                    sender_name="Seeder",
                )
            elif n % 20 == 19:
                call = NewToolCall(f"seed_{n}", "clock", "{}", status="done", result="2026-01-01T12:00:00+00:00 (UTC)")
                SessionRepo.append_in(conn, session.id, "assistant", "", calls=[call])
            else:
                SessionRepo.append_in(
                    conn, session.id, "assistant", f"Answer {n}: it is going well, thanks for asking. " * 3
                )

    for start in range(0, count, SEED_BATCH):
        await store.db.write(lambda conn, start=start: batch(conn, start, min(start + SEED_BATCH, count)))


async def one_turn(gateway: Gateway, session: SessionRecord, text: str) -> tuple[float, float, int, float]:
    """Run one turn; return (wall seconds, CPU seconds, rounds, seconds inside tools)."""
    store = gateway.store
    # Intake (the channel's part, measured by the channel benchmarks) happens before the clock.
    event_id = f"bench:{time.monotonic_ns()}"
    await store.inbox.add(
        [NewItem(event_id, str(THREAD), "message", {"text": text, "sender": {"id": "1", "name": "Bench"}})]
    )
    item = await store.inbox.get_by_event(event_id)
    started, cpu_started = time.perf_counter(), time.process_time()
    # As the inbox does: a fresh session record, then the message consumed and the run started.
    current = await store.sessions.get(session.id)
    assert current is not None and item is not None
    turn = await store.start_turn(session.id, str(THREAD), [(item.id, item.payload)], model=gateway.config.llm.model)
    request = TurnRequest(current, THREAD, requested_by="1", turn_started_seq=turn.rows[0].seq, started_run=turn.run)
    result = await Turn(gateway.services, request).run()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    if result.stage != "SUCCESS":
        raise RuntimeError(f"turn ended {result.stage}/{result.end_reason}: {result.error}")
    run = await store.runs.get(result.run_id)
    events = await store.runs.events(result.run_id)
    tools = sum(float(e.payload.get("duration_ms") or 0) for e in events if e.kind == "TOOL_CALL") / 1000
    return wall, cpu, run.rounds if run else 1, tools


async def measure(
    gateway: Gateway, llm: LLMProcess, session: SessionRecord, kind: str, turns: int
) -> tuple[list[float], list[float], list[float], float]:
    text = f"Hello, {TOOL_TRIGGER} and tell me the time." if kind == "tool" else "Hello, how are you?"
    per_round: list[float] = []
    cpu_per_round: list[float] = []
    server_times: list[float] = []
    cold = 0.0
    for index in range(turns + 1):
        await llm.server_seconds()  # reset
        wall, cpu, rounds, tools = await one_turn(gateway, session, text)
        server = sum(await llm.server_seconds())
        overhead = (wall - server - tools) / rounds
        if index == 0:
            cold = overhead
            continue
        per_round.append(overhead)
        cpu_per_round.append((cpu - tools) / rounds)
        server_times.append(server)
    return per_round, cpu_per_round, server_times, cold


async def run_cases(
    db: str, histories: list[int], turns: int, llm: LLMProcess, directory: Path
) -> tuple[list[Case], dict[str, float]]:
    cases: list[Case] = []
    builds: dict[str, float] = {}
    async with bench_store(db, directory) as store:
        config = bench_config(llm.base_url, str(directory / "workspace"))
        client = LLMClient(config.llm)
        gateway = Gateway(
            config, channels={"bench": FakeChannel(name="bench")}, serve_http=False, store=store, llm=client
        )
        Path(config.agent.workspace).mkdir(parents=True, exist_ok=True)
        try:
            for history in histories:
                session = await store.sessions.open(f"{THREAD}:{history}", source="bench", started_by="1", fresh=True)
                started = time.perf_counter()
                await seed(store, session, history)
                if not store.is_sqlite:  # as autovacuum would after such growth: plans see the rows
                    await store.db.write(lambda conn: conn.exec_driver_sql("ANALYZE"))
                progress(f"{db}: seeded {history} messages in {time.perf_counter() - started:.1f}s")
                for kind in ("text", "tool"):
                    per_round, cpu, server, cold = await measure(gateway, llm, session, kind, turns)
                    cases.append(Case(db, history, kind, per_round, cpu, server, cold))
                    progress(f"{db}: {history} messages, {kind} turns done")
                if history == max(histories):
                    builds = await time_builds(gateway, session, turns)
        finally:
            await client.aclose()
    return cases, builds


async def time_builds(gateway: Gateway, session: SessionRecord, repeats: int) -> dict[str, float]:
    """ContextBuilder.build alone: cold (new builder each time) and warm (cache current)."""
    from gateway.context import ContextBuilder

    config = gateway.config
    current = await gateway.store.sessions.get(session.id)
    assert current is not None
    kwargs = dict(
        system_prompt=config.agent.system_prompt, turn_started_seq=current.next_seq, notes={}, now=datetime.now(UTC),
        timezone=config.agent.timezone, workspace=config.agent.workspace, model=config.llm.model,
    )
    cold: list[float] = []
    cold_cpu: list[float] = []
    for _ in range(max(3, repeats // 4)):
        builder = ContextBuilder(gateway.store, config.context, config.llm, config.agent)
        started, cpu_started = time.perf_counter(), time.process_time()
        built = await builder.build(current, **kwargs)
        cold.append(time.perf_counter() - started)
        cold_cpu.append(time.process_time() - cpu_started)
    warm: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        await builder.build(current, **kwargs)
        warm.append(time.perf_counter() - started)
    return {
        "messages": float(len(built.messages)), "rows": float(current.next_seq - 1),
        "cold_p50": percentile(cold, 50), "cold_p95": percentile(cold, 95), "cold_cpu_p50": percentile(cold_cpu, 50),
        "warm_p50": percentile(warm, 50), "warm_p95": percentile(warm, 95),
    }


def print_cases(cases: list[Case]) -> None:
    print()
    print("Gateway-added time per round (ms): turn wall time - LLM server time - tool time, / rounds")
    print("(cpu: CPU time of the gateway process per round; cold: the first turn on the session)")
    print(
        f"{'db':<9}{'history':>8}  {'turn':<5}{'n':>4}{'p50':>9}{'p95':>9}"
        f"{'cpu p50':>9}{'cold':>9}{'llm p50':>9}   goal"
    )
    for case in cases:
        goal = ""
        if case.db == "sqlite" and case.history == 1000:
            p50 = percentile(case.per_round, 50) * 1000
            verdict = "met" if p50 <= ROUND_GOAL_MS else "MISSED"
            goal = f"p50 <= {ROUND_GOAL_MS:.0f} ms: {verdict} ({p50 / ROUND_GOAL_MS:.2f}x)"
        print(
            f"{case.db:<9}{case.history:>8}  {case.kind:<5}{len(case.per_round):>4}{ms(percentile(case.per_round, 50))}"
            f"{ms(percentile(case.per_round, 95))}{ms(percentile(case.cpu, 50))}"
            f"{ms(case.cold)}{ms(percentile(case.server, 50))}   {goal}"
        )


def print_builds(db: str, builds: dict[str, float]) -> None:
    if not builds:
        return
    print(
        f"ContextBuilder.build, {db}, {int(builds['rows'])} rows"
        f" -> {int(builds['messages'])} messages (goal <= {BUILD_GOAL_MS:.0f} ms):"
    )
    for name, label in (("warm", "warm, every later round"), ("cold", "cold, first build after a start")):
        p50 = builds[f"{name}_p50"] * 1000
        verdict = "met" if p50 <= BUILD_GOAL_MS else "MISSED"
        cpu = f", cpu p50 {builds['cold_cpu_p50'] * 1000:.1f} ms" if name == "cold" else ""
        print(
            f"  {label:<32} p50 {p50:8.1f} ms  p95 {builds[f'{name}_p95'] * 1000:8.1f} ms{cpu}"
            f"  {verdict} ({p50 / BUILD_GOAL_MS:.2f}x)"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40, help="measured turns per case (default 40)")
    parser.add_argument("--quick", action="store_true", help="10 turns per case")
    parser.add_argument("--db", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    parser.add_argument("--histories", type=int, nargs="+", default=[10, 1000, 10000])
    args = parser.parse_args()
    turns = 10 if args.quick else args.rounds
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-turn-") as tmp:
        async with LLMProcess() as llm:
            for db in database_kinds(args.db):
                cases, builds = await run_cases(db, sorted(args.histories), turns, llm, Path(tmp))
                print_cases(cases)
                print_builds(db, builds)


if __name__ == "__main__":
    asyncio.run(main())
