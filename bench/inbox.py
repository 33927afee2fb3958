"""Inbox throughput and inbox-to-reply latency, with 1 and 2 gateway instances on one database.

Run by hand:  .venv/bin/python bench/inbox.py [--threads 20] [--messages 10] [--quick] [--db sqlite postgres]

Each instance is a `Gateway` (own store engine, LLM client, instance_id and in-process channel)
in this process; all share one database, as separate processes would. The fake LLM answers at
0 ms from a child process. Two ways to send:
- paced: every thread is a user who sends the next message when the previous reply is shown
  (threads run concurrently; submissions alternate between instances, like a load balancer);
- burst: every thread submits all its messages at once (busy_mode `queue`: one turn each).
Latency = `submit` called -> reply shown by the channel; messages/s over the whole run.
Every message must be answered exactly once; a mismatch is printed. PostgreSQL runs when
GATEWAY_TEST_POSTGRES_URL is set.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

# support comes first: importing it puts the project and tests/ on sys.path.
from support import LLMProcess, bench_database, database_kinds, ms, percentile

# isort: split
from fakes.channel import FakeChannel

from gateway.app import Gateway
from gateway.config import Config
from gateway.events import InboundMessage, Prompt, Sender, ThreadKey
from gateway.store import Store

Mode = Literal["paced", "burst"]
_ids = itertools.count(1)


@dataclass
class Replies:
    """Replies shown by any instance's channel, with the time each was shown."""

    shown: dict[ThreadKey, list[float]] = field(default_factory=lambda: defaultdict(list))
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    prompts: int = 0

    def record(self, thread: ThreadKey) -> None:
        self.shown[thread].append(time.perf_counter())
        self.changed.set()

    async def wait_for(self, thread: ThreadKey, count: int, timeout: float) -> None:
        deadline = time.perf_counter() + timeout
        while len(self.shown[thread]) < count:
            self.changed.clear()
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise TimeoutError(f"{thread}: {len(self.shown[thread])} of {count} replies shown")
            try:
                await asyncio.wait_for(self.changed.wait(), remaining)
            except TimeoutError:
                pass


class TimedChannel(FakeChannel):
    """The in-process fake channel, reporting each shown reply to a shared `Replies`."""

    def __init__(self, replies: Replies):
        super().__init__(name="bench")
        self.replies = replies

    def show(self, kind: str, thread: ThreadKey, text: str, prompt: Prompt | None = None) -> str:
        if kind == "message":
            self.replies.record(thread)
        elif kind == "prompt":
            self.replies.prompts += 1
        return super().show(kind, thread, text, prompt)


@dataclass(frozen=True)
class Result:
    db: str
    instances: int
    mode: Mode
    messages: int
    replies: int
    elapsed: float
    latencies: list[float]
    server_p50: float
    stalled: str = ""  # what did not get answered in time, if anything


def bench_config(llm_url: str, workspace: str, mode: Mode, concurrency: int) -> Config:
    return Config.model_validate({
        "llm": {"base_url": llm_url, "model": "bench-model", "max_retries": 0},
        "agent": {"workspace": workspace, "system_prompt": "You are a benchmark agent.", "tools": ["clock"]},
        "inbox": {"busy_mode": "steer" if mode == "paced" else "queue", "max_concurrent_turns": concurrency},
        "scheduler": {"enabled": False},
        "serve": {"shutdown_grace": 2},
        "access": {"dm_policy": "open", "group_policy": "open"},  # the benchmark talks as people nobody listed
    })


def message(thread: ThreadKey, n: int) -> InboundMessage:
    sender = Sender(f"u-{thread.chat}", f"User {thread.chat}")
    return InboundMessage(
        thread, sender, f"Message {n}: how is it going?", f"bench:{next(_ids)}", message_id=str(next(_ids))
    )


async def paced(
    gateways: list[Gateway],
    replies: Replies,
    threads: list[ThreadKey],
    count: int,
    timeout: float,
    latencies: list[float],
) -> None:

    async def user(index: int, thread: ThreadKey) -> None:
        for n in range(count):
            gateway = gateways[(index + n) % len(gateways)]
            started = time.perf_counter()
            await gateway.submit([message(thread, n)])
            await replies.wait_for(thread, n + 1, timeout)
            latencies.append(replies.shown[thread][n] - started)

    await gather_all(user(i, t) for i, t in enumerate(threads))


async def burst(
    gateways: list[Gateway],
    replies: Replies,
    threads: list[ThreadKey],
    count: int,
    timeout: float,
    latencies: list[float],
) -> None:
    submitted: dict[ThreadKey, float] = {}

    async def user(index: int, thread: ThreadKey) -> None:
        submitted[thread] = time.perf_counter()
        await gateways[index % len(gateways)].submit([message(thread, n) for n in range(count)])

    await asyncio.gather(*(user(i, t) for i, t in enumerate(threads)))
    try:
        await gather_all(replies.wait_for(t, count, timeout) for t in threads)
    finally:
        latencies.extend(shown - submitted[t] for t in threads for shown in replies.shown[t][:count])


async def gather_all(coroutines: Iterable[Awaitable[None]]) -> None:
    """Run them all to the end; then raise the first stall (so one stuck thread does not
    leave the others running unobserved)."""
    outcomes = await asyncio.gather(*coroutines, return_exceptions=True)
    stalls = [o for o in outcomes if isinstance(o, BaseException)]
    if stalls:
        raise TimeoutError(f"{len(stalls)} thread(s) stalled, e.g. {stalls[0]}")


async def run_case(
    db: str,
    make_store: Callable[[], Store],
    instances: int,
    mode: Mode,
    args: argparse.Namespace,
    llm: LLMProcess,
    workspace: str,
) -> Result:
    replies = Replies()
    config = bench_config(llm.base_url, workspace, mode, args.concurrency)
    gateways = [
        Gateway(
            config,
            channels={"bench": TimedChannel(replies)},
            serve_http=False,
            store=make_store(),
            instance_id=f"bench-{db}-{mode}-{i}",
        )
        for i in range(instances)
    ]
    for gateway in gateways:
        await gateway.start()
    threads = [ThreadKey("bench", f"{mode}{instances}-{t}", "") for t in range(args.threads)]
    latencies: list[float] = []
    stalled = ""
    try:
        await llm.server_seconds()
        started = time.perf_counter()
        send = paced if mode == "paced" else burst
        try:
            await send(gateways, replies, threads, args.messages, args.timeout, latencies)
            await asyncio.gather(*(g.inbox.wait_until_idle(args.timeout) for g in gateways))
        except TimeoutError as exc:
            stalled = str(exc)
        elapsed = time.perf_counter() - started
        server = await llm.server_seconds()
    finally:
        for gateway in gateways:
            await gateway.stop()
    total_replies = sum(len(replies.shown[t]) for t in threads)
    return Result(
        db,
        instances,
        mode,
        args.threads * args.messages,
        total_replies,
        elapsed,
        latencies,
        percentile(server, 50),
        stalled,
    )


def print_results(results: list[Result], args: argparse.Namespace) -> None:
    print()
    print(
        f"Inbox: {args.threads} threads x {args.messages} messages,"
        f" fake LLM at 0 ms, max_concurrent_turns {args.concurrency} per instance"
    )
    print(f"{'db':<9}{'inst':>5}  {'mode':<6}{'msgs/s':>9}{'p50 ms':>9}{'p95 ms':>9}{'llm p50':>9}  answered")
    for r in results:
        answered = (
            "exactly once" if r.replies == r.messages else f"MISMATCH: {r.replies} replies to {r.messages} messages"
        )
        if r.stalled:
            answered = f"STALLED ({r.replies} replies to {r.messages} messages): {r.stalled}"
        print(
            f"{r.db:<9}{r.instances:>5}  {r.mode:<6}{r.replies / r.elapsed:9.1f}{ms(percentile(r.latencies, 50))}"
            f"{ms(percentile(r.latencies, 95))}{ms(r.server_p50)}  {answered}"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=20)
    parser.add_argument("--messages", type=int, default=10, help="messages per thread")
    parser.add_argument(
        "--concurrency", type=int, default=8, help="inbox.max_concurrent_turns per instance (default 8)"
    )
    parser.add_argument("--quick", action="store_true", help="10 threads x 4 messages")
    parser.add_argument("--db", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    parser.add_argument("--modes", nargs="+", default=["paced", "burst"], choices=["paced", "burst"])
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for any one thread's replies")
    args = parser.parse_args()
    if args.quick:
        args.threads, args.messages = 10, 4
    logging.basicConfig(level=logging.WARNING)
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="bench-inbox-") as tmp:
        async with LLMProcess() as llm:
            for db in database_kinds(args.db):
                for instances in (1, 2):
                    for mode in args.modes:
                        async with bench_database(db, Path(tmp)) as make_store:
                            results.append(
                                await run_case(db, make_store, instances, mode, args, llm, str(Path(tmp) / "workspace"))
                            )
                        print(f"  .. {db}, {instances} instance(s), {mode}: done", file=sys.stderr, flush=True)
    print_results(results, args)


if __name__ == "__main__":
    asyncio.run(main())
