"""Replies per second through the Telegram channel against the fake Bot API (50 chats).

Run by hand:  .venv/bin/python bench/telegram_replies.py [--chats 50] [--replies 20]

Measures the channel's send path (render, split, PTB over HTTP to the fake on loopback):
once with pacing off (raw throughput) and once with the default flood-limit pacing
(30 messages/s overall, which is what Telegram allows), plus streamed replies in groups
and the polling ingest rate. The core (LLM, inbox) is not involved.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fakes.telegram import FakeTelegram  # noqa: E402
from fakes.telegram_core import RecordingCore  # noqa: E402

from channels.telegram import TelegramChannel  # noqa: E402
from gateway.config import TelegramConfig  # noqa: E402
from gateway.events import Outbound, ThreadKey  # noqa: E402

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


async def main(chats: int, per_chat: int) -> None:
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


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=50)
    parser.add_argument("--replies", type=int, default=20, help="replies per chat")
    args = parser.parse_args()
    asyncio.run(main(args.chats, args.replies))
