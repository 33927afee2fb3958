"""Events per second accepted at POST /slack/events, and the ack latency Slack would see.

Run by hand:  .venv/bin/python bench/slack_events.py [--events 1000] [--concurrency 20] [--store sqlite]

Each request is a signed `app_mention` (its own thread) posted over loopback to the channel's
aiohttp route: signature check, bolt dispatch, `submit`, then the 200. `--store memory` (the
default) measures the channel alone with an in-memory submit; `--store sqlite` commits every
event to the real inbox table in a temporary SQLite file first (durable insert), which is
what production does. Prints throughput and p50/p95/max ack latency (Slack's limit is 3 s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from aiohttp import web  # noqa: E402
from fakes.slack import SIGNING_SECRET, FakeSlack, MemoryState, RecordingSubmit, SlackEventSender, slack_config  # noqa: E402

from channels.slack import SlackChannel  # noqa: E402
from gateway.events import InboundEvent, SubmitResult  # noqa: E402


async def sqlite_submit(directory: str) -> tuple[Any, Any]:
    """The core's durable insert (inbox table, unique event id) on a fresh SQLite file."""
    from gateway.inbox import event_item
    from gateway.store import Store

    store = Store(f"sqlite+aiosqlite:///{directory}/bench.db")
    await store.migrate()

    async def submit(events: Sequence[InboundEvent], *, cursor: tuple[str, str] | None = None) -> list[SubmitResult]:
        created = await store.inbox.add([event_item(e) for e in events], cursor=cursor)  # type: ignore[arg-type]
        return [SubmitResult(e.event_id, duplicate=not new) for e, new in zip(events, created)]

    return submit, store


async def serve(channel: SlackChannel) -> tuple[web.AppRunner, str]:
    app = web.Application()
    for method, path, handler in channel.routes():
        app.router.add_route(method, path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/slack/events"


async def post_all(sender: SlackEventSender, count: int, concurrency: int) -> tuple[list[float], int]:
    bodies = [json.dumps(sender.envelope(sender.mention("C1", "U1", f"<@UBOT> question {i}"))) for i in range(count)]
    latencies: list[float] = []
    failures = 0
    queue: asyncio.Queue[str] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)

    async def worker() -> None:
        nonlocal failures
        while not queue.empty():
            body = queue.get_nowait()
            started = time.perf_counter()
            reply = await sender.post(body)
            latencies.append(time.perf_counter() - started)
            failures += reply.status != 200

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, failures


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def main(events: int, concurrency: int, store_kind: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        async with FakeSlack() as fake:
            store = None
            if store_kind == "sqlite":
                submit, store = await sqlite_submit(directory)
            else:
                submit = RecordingSubmit()
            channel = SlackChannel(slack_config(fake), MemoryState())
            await channel.start(submit)
            runner, url = await serve(channel)
            async with SlackEventSender(url, SIGNING_SECRET) as sender:
                await post_all(sender, 20, 4)  # warm up: auth.test, users.info cache, connections
                started = time.perf_counter()
                latencies, failures = await post_all(sender, events, concurrency)
                elapsed = time.perf_counter() - started
            await runner.cleanup()
            await channel.stop()
            if store is not None:
                await store.close()
    ms = [value * 1000 for value in latencies]
    print(f"store={store_kind} events={events} concurrency={concurrency} non-200={failures}")
    print(f"accepted: {events / elapsed:,.0f} events/s ({elapsed:.2f} s)")
    print(f"ack latency ms: p50 {percentile(ms, 0.50):.1f}  p95 {percentile(ms, 0.95):.1f}  "
          f"max {max(ms):.1f}  mean {statistics.fmean(ms):.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    args = parser.parse_args()
    asyncio.run(main(args.events, args.concurrency, args.store))
