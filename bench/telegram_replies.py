"""Replies per second through the Telegram channel against the fake Bot API (50 chats).

Run by hand:  .venv/bin/python bench/telegram_replies.py [--chats 50] [--replies 20]
              [--turns 5] [--database URL] [--only channel|gateway]

Channel figures: the send path (render, split, PTB over HTTP to the fake on loopback) once
with pacing off (raw throughput) and once with the default flood-limit pacing (30 messages/s
overall, what Telegram allows), streamed replies in groups, and the polling ingest rate.

Gateway figures: the whole path, end to end. Each chat sends a message, waits for the reply,
and sends the next (`--turns` per chat): getUpdates -> inbox (SQLite, or `--database`) ->
worker -> turn -> fake LLM (0 ms) -> outbox -> drafts + sendMessage. Reported with the
default `inbox.max_concurrent_turns` (8) and with one slot per chat, pacing off.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fakes.llm import FakeLLM, Reply
from fakes.telegram import FakeTelegram
from fakes.telegram_core import RecordingCore

from channels.telegram import TelegramChannel
from gateway.app import Gateway
from gateway.config import Config, TelegramConfig
from gateway.events import Outbound, ThreadKey
from gateway.llm import LLMClient
from gateway.store import Store

REPLY = "Here is the **answer** with `code`:\n\n```python\nprint('hello')\n```\n\n- one\n- two\n"


async def channel_for(fake: FakeTelegram, **settings: object) -> TelegramChannel:
    core = RecordingCore()
    config = TelegramConfig(token=fake.token, api_base_url=fake.base_url, poll_timeout_s=1, **settings)
    channel = TelegramChannel(config, core)
    await channel.start(core.submit)
    return channel


async def replies(channel: TelegramChannel, chats: int, per_chat: int) -> tuple[float, list[float]]:
    latencies: list[float] = []

    async def one_chat(chat: int) -> None:
        thread = ThreadKey("telegram", str(chat if chat % 2 else -chat))
        for n in range(per_chat):
            started = time.perf_counter()
            await channel.send(Outbound(thread, f"{REPLY}#{n}", key=f"{chat}:{n}"))
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(one_chat(c) for c in range(1, chats + 1)))
    return time.perf_counter() - started, latencies


async def streamed(channel: TelegramChannel, chats: int) -> float:
    async def one_chat(chat: int) -> None:
        stream = channel.open_stream(ThreadKey("telegram", str(-1000 - chat)))
        text = ""
        for n in range(40):
            text += f"token{n} "
            await stream.update(text)
        await stream.finish(text)

    started = time.perf_counter()
    await asyncio.gather(*(one_chat(c) for c in range(chats)))
    return time.perf_counter() - started


async def ingest(fake: FakeTelegram, channel: TelegramChannel, count: int) -> float:
    core = channel.state
    assert isinstance(core, RecordingCore)
    for n in range(count):
        fake.private_message(1 + n % 50, f"message {n}")
    started = time.perf_counter()
    task = asyncio.create_task(channel.poll_forever())
    while len(core.events) < count:
        await asyncio.sleep(0.005)
    elapsed = time.perf_counter() - started
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return elapsed


def report(label: str, elapsed: float, latencies: list[float]) -> None:
    ordered = sorted(latencies)
    p95 = ordered[int(len(ordered) * 0.95) - 1]
    print(f"{label:<28} {len(latencies) / elapsed:8.1f} replies/s   "
          f"p50 {statistics.median(ordered) * 1000:6.1f} ms   p95 {p95 * 1000:6.1f} ms")


async def channel_figures(chats: int, per_chat: int) -> None:
    unpaced = {"rate_overall_per_s": 0, "rate_private_per_s": 0, "rate_group_per_min": 0}
    async with FakeTelegram() as fake:
        channel = await channel_for(fake, **unpaced)
        elapsed, latencies = await replies(channel, chats, per_chat)
        report(f"send, {chats} chats, no pacing", elapsed, latencies)
        await channel.stop()

        channel = await channel_for(fake, rate_private_per_s=0, rate_group_per_min=0)
        elapsed, latencies = await replies(channel, chats, max(1, per_chat // 4))
        report(f"send, {chats} chats, 30/s pacing", elapsed, latencies)
        await channel.stop()

        channel = await channel_for(fake, edit_interval_s=0.05, **unpaced)
        elapsed = await streamed(channel, chats)
        edits = len(fake.calls_to("editMessageText"))
        print(f"{'streamed group replies':<28} {chats / elapsed:8.1f} replies/s   ({edits} edits)")
        await channel.stop()

        channel = await channel_for(fake, **unpaced)
        count = 5000
        elapsed = await ingest(fake, channel, count)
        print(f"{'polling ingest':<28} {count / elapsed:8.1f} updates/s")
        await channel.stop()


# --- the whole gateway ---------------------------------------------------------------


def gateway_config(fake: FakeTelegram, llm: FakeLLM, workspace: str, slots: int) -> Config:
    data: dict[str, Any] = {
        "llm": {"base_url": llm.base_url, "model": "bench-model"},
        "agent": {"workspace": workspace},
        "inbox": {"max_concurrent_turns": slots},  # the default poll interval: submit wakes workers
        "scheduler": {"enabled": False},
        "serve": {"shutdown_grace": 2},
        "access": {"dm_policy": "open", "group_policy": "open"},  # the benchmark talks as people nobody listed
        "telegram": {"token": fake.token, "api_base_url": fake.base_url, "poll_timeout_s": 1,
                     "rate_overall_per_s": 0, "rate_private_per_s": 0, "rate_group_per_min": 0},
    }
    return Config.model_validate(data)


async def conversation(fake: FakeTelegram, chat: int, turns: int, latencies: list[float]) -> None:
    """One person: a message, wait for the reply, the next message."""
    for n in range(turns):
        started = time.perf_counter()
        fake.private_message(chat, f"question {n}")
        while len(fake.bot_messages(chat)) <= n:
            await asyncio.sleep(0.002)
        latencies.append(time.perf_counter() - started)


@contextlib.asynccontextmanager
async def fresh_store(database: str | None, tmp: str) -> AsyncIterator[Store]:
    """A new SQLite file, or a throwaway schema in the given PostgreSQL database."""
    if not database or not database.startswith("postgresql"):
        store = Store(database or f"sqlite+aiosqlite:///{tmp}/bench.db")
        await store.migrate()
        yield store
        return
    import asyncpg

    schema = f"bench_telegram_{uuid.uuid4().hex[:12]}"
    dsn = database.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(dsn)
    await conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        store = Store(database, pg_schema=schema)
        await store.migrate()
        yield store
    finally:
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
        await conn.close()


async def through_gateway(chats: int, turns: int, database: str | None, slots: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with FakeTelegram() as fake, FakeLLM(responder=lambda request: Reply(REPLY)) as llm, \
                fresh_store(database, tmp) as store:
            config = gateway_config(fake, llm, f"{tmp}/ws", slots)
            gateway = Gateway(config, store=store, llm=LLMClient(config.llm), serve_http=False)
            await gateway.start()
            latencies: list[float] = []
            started = time.perf_counter()
            try:
                await asyncio.gather(*(conversation(fake, 1000 + c, turns, latencies) for c in range(chats)))
                elapsed = time.perf_counter() - started
            finally:
                await gateway.stop()
            report(f"gateway, {chats} chats, {slots} slots", elapsed, latencies)
            sends = len(fake.calls_to("sendMessage"))
            print(f"{'':<28} {len(llm.requests)} LLM calls, {sends} sendMessage, "
                  f"{len(fake.calls_to('sendMessageDraft'))} drafts, {len(fake.calls_to('getUpdates'))} polls")
            if sends != chats * turns:
                print(f"  !! expected {chats * turns} replies, the fake received {sends}")


async def main(chats: int, per_chat: int, turns: int, database: str | None, only: str | None) -> None:
    if only in (None, "channel"):
        await channel_figures(chats, per_chat)
    if only in (None, "gateway"):
        for slots in (8, chats):
            await through_gateway(chats, turns, database, slots)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--replies", type=int, default=20, help="replies per chat (channel figures)")
    parser.add_argument("--turns", type=int, default=5, help="messages per chat (gateway figures)")
    parser.add_argument("--database", help="store URL for the gateway figures (default: a fresh SQLite file; "
                        "a PostgreSQL URL gets a throwaway schema)")
    parser.add_argument("--only", choices=["channel", "gateway"])
    args = parser.parse_args()
    asyncio.run(main(args.chats, args.replies, args.turns, args.database, args.only))
