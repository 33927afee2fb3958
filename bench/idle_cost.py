"""What known but idle threads cost a running gateway: memory and CPU while nothing happens.

Run by hand:  .venv/bin/python bench/idle_cost.py [--db sqlite|postgres|both] [--threads 100000]
              [--seconds 60]

For each database, twice: once on an empty database, once seeded with `--threads` Telegram
private chats that each have a history (a thread, its session, a user message and the reply,
the finished run, the inbox item done, the outbox row sent, the thread's lease released), none
active. `gateway serve` (Telegram long polling against the fake Bot API, as in
bench/gateway_load.py) starts on it; once ready and settled, its RSS and CPU time (all threads,
from /proc) are read over `--seconds` of idleness. The figures: RSS and CPU seconds of each run,
and the difference the threads make (goal: <= 50 MB and no CPU beyond the empty database's).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_load import (  # noqa: E402
    CHUNK_CHARS,
    GatewayProcess,
    LoadTelegram,
    commit,
    database_url,
    free_port,
    load_average,
    telegram_section,
    write_config,
)
from support import LLMProcess, postgres_url  # noqa: E402

BATCH = 5_000


async def seed(url: str, count: int) -> float:
    """`count` idle threads with a history, inserted in batches; returns the seconds it took."""
    from sqlalchemy import func, insert, select
    from sqlalchemy.engine import Connection

    from gateway.events import utcnow
    from gateway.store.db import Database
    from gateway.store.tables import inbox, leases, messages, outbox, runs, sessions, threads

    started = time.perf_counter()
    db = Database(url)
    then = utcnow() - timedelta(days=1)
    first = (await db.read(lambda conn: conn.execute(select(func.max(sessions.c.id))).scalar()) or 0) + 1

    def batch(conn: Connection, chats: range) -> None:
        keys = [f"telegram:{700_000_000 + n}:" for n in chats]
        ids = [first + n for n in chats]
        conn.execute(insert(sessions), [
            {"id": sid, "thread_key": key, "kind": "interactive", "interactive": True, "ephemeral": False,
             "source": "telegram", "started_by": "bench", "next_seq": 3, "notes": {}, "created_at": then}
            for sid, key in zip(ids, keys, strict=True)])
        conn.execute(insert(threads), [
            {"key": key, "channel": "telegram", "session_id": sid, "created_at": then}
            for sid, key in zip(ids, keys, strict=True)])
        conn.execute(insert(runs), [
            {"id": sid, "session_id": sid, "thread_key": key, "stage": "SUCCESS", "end_reason": "done",
             "model": "bench-model", "next_event_seq": 1, "input_tokens": 120, "output_tokens": 40,
             "llm_calls": 1, "rounds": 1, "started_at": then, "finished_at": then}
            for sid, key in zip(ids, keys, strict=True)])
        conn.execute(insert(messages), [
            row for sid in ids for row in (
                {"session_id": sid, "seq": 1, "role": "user", "content": "what does load_config do?",
                 "sender_id": "42", "sender_name": "Ann", "run_id": sid, "created_at": then},
                {"session_id": sid, "seq": 2, "role": "assistant", "content": "It reads the file once.",
                 "sender_id": None, "sender_name": None, "run_id": sid, "created_at": then})])
        conn.execute(insert(inbox), [
            {"event_id": f"tg:bench:{sid}", "thread_key": key, "kind": "message",
             "payload": {"text": "what does load_config do?"}, "status": "done", "session_id": sid,
             "created_at": then, "done_at": then}
            for sid, key in zip(ids, keys, strict=True)])
        conn.execute(insert(outbox), [
            {"key": f"reply:{sid}", "thread_key": key, "kind": "message", "payload": {"text": "It reads"},
             "status": "sent", "message_ids": [str(sid)], "attempts": 1, "created_at": then, "sent_at": then}
            for sid, key in zip(ids, keys, strict=True)])
        conn.execute(insert(leases), [
            {"name": f"thread:{key}", "owner": None, "fence": 1, "expires_at": None} for key in keys])

    for base in range(0, count, BATCH):
        chats = range(base, min(count, base + BATCH))
        await db.write(lambda conn, chats=chats: batch(conn, chats))
    await db.dispose()
    return time.perf_counter() - started


async def idle(kind: str, threads: int, args: argparse.Namespace) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        async with LLMProcess(CHUNK_CHARS) as llm, LoadTelegram() as fake, database_url(kind, directory) as db:
            port = free_port()
            config = write_config(directory, db, llm.base_url, port, telegram=telegram_section(fake, True))
            gateway = GatewayProcess(config, port, directory / "gateway.log", {"TELEGRAM_BOT_TOKEN": fake.token})
            await gateway.start()  # creates the schema
            await gateway.stop()
            took = await seed(db, threads) if threads else 0.0
            gateway = GatewayProcess(config, port, directory / "gateway.log", {"TELEGRAM_BOT_TOKEN": fake.token})
            await gateway.start()
            try:
                await asyncio.sleep(args.settle)  # the start's own work (leases, maintenance, the first sweeps)
                rss_before = gateway.memory_mb()[0]
                cpu, load = gateway.cpu_seconds(), load_average()
                await asyncio.sleep(args.seconds)
                cpu = gateway.cpu_seconds() - cpu
                rss, peak = gateway.memory_mb()
                figures = {"rss": rss, "rss_start": rss_before, "peak": peak, "cpu": cpu,
                           "load": max(load, load_average()), "seed_s": took}
            finally:
                await gateway.stop()
    print(f"{kind:<9} {threads:>8} {figures['rss_start']:9.1f} {figures['rss']:9.1f} {figures['peak']:9.1f} "
          f"{figures['cpu']:8.2f} {figures['cpu'] * 1000 / args.seconds:9.2f} {figures['load']:6.1f}"
          f"{f'   (seeded in {took:.0f} s)' if threads else ''}")
    return figures


async def main(args: argparse.Namespace) -> None:
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    if "postgres" in kinds and not postgres_url():
        print("note: PostgreSQL skipped: GATEWAY_TEST_POSTGRES_URL is not set")
        kinds.remove("postgres")
    print(f"idle cost of known threads (commit {commit()}): RSS after {args.settle:.0f} s settled and after "
          f"{args.seconds:.0f} s idle, CPU over those {args.seconds:.0f} s")
    print(f"{'db':<9} {'threads':>8} {'RSS0 MB':>9} {'RSS MB':>9} {'peak MB':>9} {'cpu s':>8} {'cpu ms/s':>9} "
          f"{'load':>6}")
    for kind in kinds:
        empty = await idle(kind, 0, args)
        seeded = await idle(kind, args.threads, args)
        extra_rss = seeded["rss"] - empty["rss"]
        extra_cpu = seeded["cpu"] - empty["cpu"]
        print(f"{kind}: {args.threads} idle threads cost {extra_rss:+.1f} MB RSS (goal <= 50 MB: "
              f"{'met' if extra_rss <= 50 else 'MISSED'}) and {extra_cpu:+.2f} s CPU over {args.seconds:.0f} s idle "
              f"({extra_cpu * 1000 / args.seconds:+.2f} ms/s against the empty database)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="sqlite")
    parser.add_argument("--threads", type=int, default=100_000)
    parser.add_argument("--seconds", type=float, default=60.0, help="idle time measured")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after ready before measuring")
    asyncio.run(main(parser.parse_args()))
