"""Events per second accepted at the gateway's POST /slack/events, and the ack latency Slack sees.

Run by hand:
    .venv/bin/python bench/slack_events.py [--events 1000] [--concurrency 20] [--db sqlite postgres]
                                           [--mode intake full]

A real `Gateway` (its aiohttp server, the SlackChannel with the bolt app, the inbox) on a fresh
SQLite file or a throwaway PostgreSQL schema (when GATEWAY_TEST_POSTGRES_URL is set). Each
request is a signed `app_mention` opening its own thread, posted over loopback; the 200 comes
back after the signature check, bolt's dispatch and the durable inbox insert.

- `intake`: the HTTP server and the channel only (no inbox workers), so the figure is the
  accept path alone; afterwards every event must be pending in the inbox.
- `full`: the whole gateway runs, answering each event (fake LLM in a child process, FakeSlack
  in this process) while the requests keep coming: the ack latency under load. Afterwards it
  waits until every thread has its reply and prints how long that took.

Prints events/s and p50/p95/max ack latency (Slack's limit is 3 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "tests")]

from fakes.slack import SIGNING_SECRET, FakeSlack, SlackEventSender
from support import LLMProcess, bench_store, database_kinds, percentile

from gateway.app import Gateway
from gateway.config import Config
from gateway.store import Store

WARM_UP = 20
CHANNELS = 50  # events are spread over channels, as a workspace's traffic is


def gateway_config(llm_url: str, slack: FakeSlack, workspace: Path) -> Config:
    return Config.model_validate({
        "llm": {"base_url": llm_url, "model": "bench-model", "max_retries": 1},
        "agent": {"workspace": str(workspace), "system_prompt": "You are a benchmark agent."},
        "slack": {"bot_token": slack.token, "signing_secret": SIGNING_SECRET, "api_base_url": slack.base_url,
                  "send_interval_s": 0, "stream_interval_s": 0.2},
        "http": {"port": 0},
        "inbox": {"poll_interval_s": 0.2},
        "scheduler": {"enabled": False},
        "access": {"dm_policy": "open", "group_policy": "open"},  # the benchmark talks as people nobody listed
    })


@contextlib.asynccontextmanager
async def serving(store: Store, config: Config, mode: str) -> AsyncIterator[Gateway]:
    """The gateway with everything (`full`) or only its intake (`intake`) running."""
    gateway = Gateway(config, store=store, serve_http=True)
    if mode == "full":
        await gateway.start()
    else:
        await gateway.channels["slack"].start(gateway.submit)
        await gateway.http.start()  # type: ignore[union-attr]
    try:
        yield gateway
    finally:
        if mode == "full":
            await gateway.stop()
        else:
            await gateway.http.stop()  # type: ignore[union-attr]
            await gateway.channels["slack"].stop()
            await gateway.llm.aclose()


def mention_bodies(sender: SlackEventSender, count: int) -> list[str]:
    return [json.dumps(sender.envelope(sender.mention(f"C{i % CHANNELS}", "U1", f"<@UBOT> question {i}")))
            for i in range(count)]


async def post_all(sender: SlackEventSender, bodies: list[str], concurrency: int) -> tuple[list[float], int]:
    """Posts every body with `concurrency` requests in flight; (latencies, non-200 count)."""
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


def replied_threads(slack: FakeSlack) -> int:
    return len({(channel, m.get("thread_ts")) for channel, messages in slack.messages.items()
                for m in messages if m.get("user") == slack.bot_user_id and m.get("thread_ts")})


async def wait_for_replies(slack: FakeSlack, expected: int, timeout: float) -> float | None:
    started = time.perf_counter()
    while replied_threads(slack) < expected:
        if time.perf_counter() - started > timeout:
            return None
        await asyncio.sleep(0.05)
    return time.perf_counter() - started


async def run_case(kind: str, mode: str, events: int, concurrency: int, llm_url: str, directory: Path) -> str:
    async with FakeSlack() as slack, bench_store(kind, directory) as store:
        config = gateway_config(llm_url, slack, directory / "ws")
        async with serving(store, config, mode) as gateway:
            url = f"http://127.0.0.1:{gateway.http.port}/slack/events"  # type: ignore[union-attr]
            async with SlackEventSender(url, SIGNING_SECRET, team_id=slack.team_id) as sender:
                await post_all(sender, mention_bodies(sender, WARM_UP), 4)  # auth, names, connections
                bodies = mention_bodies(sender, events)
                started = time.perf_counter()
                latencies, failures = await post_all(sender, bodies, concurrency)
                elapsed = time.perf_counter() - started
            if mode == "intake":
                pending = await store.inbox.count_pending()
                check = "ok" if pending == events + WARM_UP else f"MISMATCH: {pending} pending"
            else:
                answered = await wait_for_replies(slack, events + WARM_UP, timeout=max(60.0, events * 0.5))
                check = f"all answered {answered:.1f} s after the last ack" if answered is not None else "STALLED"
    ms = sorted(value * 1000 for value in latencies)
    return (f"{kind:<8} {mode:<6} {events:>6} {concurrency:>4} {events / elapsed:>9,.0f} "
            f"{percentile(ms, 50):>8.1f} {percentile(ms, 95):>8.1f} {ms[-1]:>8.1f} {failures:>6}  {check}")


async def main(args: argparse.Namespace) -> None:
    print(f"{'db':<8} {'mode':<6} {'events':>6} {'conc':>4} {'events/s':>9} {'p50 ms':>8} {'p95 ms':>8} "
          f"{'max ms':>8} {'non200':>6}  check")
    async with LLMProcess() as llm:
        for kind in database_kinds(args.db):
            for mode in args.mode:
                with tempfile.TemporaryDirectory() as directory:
                    line = await run_case(kind, mode, args.events, args.concurrency, llm.base_url, Path(directory))
                print(line, flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--db", nargs="+", choices=("sqlite", "postgres"), default=["sqlite", "postgres"])
    parser.add_argument("--mode", nargs="+", choices=("intake", "full"), default=["intake", "full"])
    asyncio.run(main(parser.parse_args()))
