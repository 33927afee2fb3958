"""Scheduler benchmark: how many firings per second the claim path sustains, and how late a
firing's prompt enters the inbox after its scheduled time (p50/p95) with the live clock.

    .venv/bin/python bench/scheduler_claims.py                     # SQLite in a temp dir
    .venv/bin/python bench/scheduler_claims.py --url postgresql+asyncpg://postgres@127.0.0.1:5432/test

The claim path is the whole firing: claim the (schedule, time) row, open the ephemeral
session, submit the prompt into the inbox. Two schedulers on separate stores race for every
firing, as two briefly overlapping leaders would.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.config import SchedulerConfig  # noqa: E402
from gateway.events import Delivered, InboundEvent, SubmitResult  # noqa: E402
from gateway.store import NewItem, Store  # noqa: E402
from scheduler.definitions import job_config, to_schedule  # noqa: E402
from scheduler.jobs import Scheduler, schedule_repo  # noqa: E402


class Intake:
    """Submit into the store's inbox (as the core does) and note when each prompt arrived."""

    def __init__(self, store: Store):
        self.store = store
        self.arrived: dict[str, datetime] = {}

    async def submit(
        self, events: Sequence[InboundEvent], *, cursor: tuple[str, str] | None = None
    ) -> list[SubmitResult]:
        items = [NewItem(e.event_id, str(e.thread), "message", {"text": getattr(e, "text", "")}) for e in events]
        created = await self.store.inbox.add(items, cursor=cursor)
        for event in events:
            self.arrived.setdefault(event.event_id, datetime.now(UTC))
        return [SubmitResult(e.event_id, duplicate=not new) for e, new in zip(events, created, strict=False)]


async def no_delivery(message) -> Delivered:  # noqa: ANN001
    return Delivered(())


async def open_store(url: str, schema: str | None) -> Store:
    store = Store(url, pg_schema=schema)
    await store.migrate()
    return store


async def make_schema(url: str) -> str | None:
    if url.startswith("sqlite"):
        return None
    import asyncpg

    schema = f"bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    await conn.close()
    return schema


async def drop_schema(url: str, schema: str | None) -> None:
    if schema is None:
        return
    import asyncpg

    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    await conn.close()


async def add_jobs(store: Store, count: int, prefix: str, **fields) -> list[int]:
    config, now, ids = SchedulerConfig(), datetime.now(UTC), []
    for i in range(count):
        new = to_schedule(
            job_config({"name": f"{prefix}-{i}", "prompt": "bench", **fields}), config, source="cli", now=now
        )
        ids.append((await schedule_repo(store).create(new, now=now)).id)
    return ids


async def claim_throughput(url: str, schema: str | None, jobs: int, rounds: int) -> None:
    store_a, store_b = await open_store(url, schema), await open_store(url, schema)
    intake_a, intake_b = Intake(store_a), Intake(store_b)
    a = Scheduler(store_a, SchedulerConfig(), submit=intake_a.submit, deliver=no_delivery)
    b = Scheduler(store_b, SchedulerConfig(), submit=intake_b.submit, deliver=no_delivery)
    ids = await add_jobs(store_a, jobs, "claim", every="1h")
    base = datetime.now(UTC).replace(microsecond=0)
    started = time.perf_counter()
    for r in range(rounds):
        when = base - timedelta(seconds=rounds - r)
        # each firing is claimed by both schedulers at once; the earlier run of a job is still
        # "running", so from the second round on a firing is recorded `skipped`
        await asyncio.gather(*(s.fire(i, when) for i in ids for s in (a, b)))
    elapsed = time.perf_counter() - started
    firings = jobs * rounds
    runs = len(intake_a.arrived) + len(intake_b.arrived)
    print(f"claim path: {firings} firings ({2 * firings} claims, {runs} runs started) in {elapsed:.2f}s "
          f"= {firings / elapsed:.0f} firings/s, {2 * firings / elapsed:.0f} claim attempts/s")
    counted = await schedule_repo(store_a).count_runs()
    assert counted == firings, f"expected one job_runs row per firing, found {counted}"
    await store_a.close()
    await store_b.close()


async def firing_delay(url: str, schema: str | None, jobs: int, spread_s: float) -> None:
    """`jobs` one-shot firings spread evenly over `spread_s` (0: all at the same instant)."""
    store = await open_store(url, schema)
    intake = Intake(store)
    scheduler = Scheduler(store, SchedulerConfig(poll_interval=3600), submit=intake.submit, deliver=no_delivery)
    start = datetime.now(UTC) + timedelta(seconds=3)
    base = to_schedule(
        job_config({"name": "delay", "prompt": "bench", "every": "1h"}), SchedulerConfig(), source="cli", now=start
    )
    ids = []
    for i in range(jobs):
        when = start + timedelta(seconds=spread_s * i / jobs)
        new = replace(base, name=f"delay-{i}", kind="at", spec=when.isoformat())  # microsecond precision
        ids.append((await schedule_repo(store).create(new)).id)
    began = time.perf_counter()
    await scheduler.start()
    started_ms = (time.perf_counter() - began) * 1000
    deadline = time.monotonic() + spread_s + 30
    while len(intake.arrived) < jobs and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await scheduler.stop()
    delays = []
    for schedule_id in ids:
        [run] = await schedule_repo(store).recent_runs(schedule_id, limit=1)
        arrived = intake.arrived.get(f"job:{run.id}")
        if arrived is not None:
            delays.append((arrived - run.scheduled_for).total_seconds() * 1000)
    delays.sort()
    shape = f"{jobs} firings at one instant" if spread_s == 0 else f"{jobs} firings over {spread_s:.0f}s"
    if len(delays) < 2:
        print(f"firing delay, {shape}: only {len(delays)} prompts arrived")
    else:
        p95 = statistics.quantiles(delays, n=20)[-1]
        print(
            f"firing delay (scheduled time -> prompt in the inbox), {shape}: p50 {statistics.median(delays):.1f} ms, "
            f"p95 {p95:.1f} ms, max {delays[-1]:.1f} ms"
            f" ({len(delays)}/{jobs} arrived; start planned them in {started_ms:.0f} ms)"
        )
    await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="database URL (default: SQLite in a temp dir)")
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--delay-jobs", type=int, default=100)
    parser.add_argument("--spread", type=float, default=5.0, help="seconds over which the delay firings are spread")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        url = args.url or f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}"
        print(f"database: {url.split('@')[-1]}")
        for bench in (
            lambda schema: claim_throughput(url, schema, args.jobs, args.rounds),
            lambda schema: firing_delay(url, schema, args.delay_jobs, args.spread),
            lambda schema: firing_delay(url, schema, args.delay_jobs, 0),
        ):
            schema = await make_schema(url)
            try:
                await bench(schema)
            finally:
                await drop_schema(url, schema)
            if url.startswith("sqlite"):
                Path(url.split("///", 1)[1]).unlink(missing_ok=True)


if __name__ == "__main__":
    asyncio.run(main())
