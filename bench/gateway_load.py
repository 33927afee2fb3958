"""The whole gateway under load: `gateway serve` as a process against the fakes (issue 14).

Run by hand:  .venv/bin/python bench/gateway_load.py [--db sqlite|postgres|both]
              [--only steady,thousand,slack] [--chats 20] [--messages 200] [--quick]
              [--turns 1000] [--instances 1] [--slots N] [--pool-size N] [--max-overflow N]
              [--peer auto|on|off]

The gateway runs as its own process (`python -m gateway serve`, a config written here) so its
CPU time is read from /proc: nothing of the driver, the fake Bot API or the fake LLM is counted.
The fake LLM runs in a third process (bench/support.py) and streams 4-character chunks of a
~200-token Markdown reply; the fake Bot API (tests/fakes/telegram.py, long polling) and the fake
Slack Web API run in this one.

- `steady`: cold start (spawn -> /readyz 200 on a current schema), the first reply after ready,
  then `--messages` messages over `--chats` private chats, each chat sending its next message
  when the reply is shown; once plain, once with one tool call (`clock`) per message. Then the
  same for the peer, nanobot-ai (bench/peer.py; `--peer auto` runs it when installed), so the
  ratio of the two CPU figures comes from one run on one machine.
  Figures: gateway CPU ms per message, messages/s, p50/p95 latency (update queued -> final
  sendMessage received), peak RSS, and the statements and transactions sent to the database per
  message (the gateway's /metrics counters; on PostgreSQL each statement is a round trip, and
  each transaction adds its BEGIN and COMMIT).
- `thousand`: `--turns` (1,000) private chats at once, each turn streaming a chunk every 50 ms
  for 10 s, over `--instances` (1) `gateway serve` processes on one database (several: PostgreSQL;
  `--instances 3 --db postgres --turns 10000` is the scale-out case), each with its own fake LLM
  process. Every reply must arrive exactly once; sends are checked against Telegram's limits for
  the bot as a whole (30 in any second, drafts, typing and edits counted too; 1/s per chat with
  bursts of 3); per instance: event-loop lag p50/p99 from its /metrics, CPU, peak RSS and, on
  PostgreSQL, the most connections it held (pg_stat_activity, sampled every second); the commit
  and the machine's load average are printed with them.
- `slack`: signed events posted to /slack/events (HTTP Events API mode), the replies through
  the fake Slack Web API: events/s accepted, CPU per Slack reply, p50/p95.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp  # noqa: E402
import peer  # noqa: E402
from fakes.telegram import FakeTelegram  # noqa: E402
from support import TOOL_TRIGGER, LLMProcess, percentile, postgres_url  # noqa: E402

# About 200 tokens of the Markdown a model writes: paragraphs, emphasis, code, a list, a link.
REPLY = (
    "Here is what I found about **your question**, in short.\n\n"
    "The function `load_config` reads the file once and caches it; a second call with the same "
    "path returns the *cached* copy, so edits made while the process runs are not seen until "
    "a restart. If you need live reloading, watch the file and call `load_config.cache_clear()`.\n\n"
    "Steps:\n\n"
    "1. Open `settings.py` and find the **loader**.\n"
    "2. Add a watcher (see [the docs](https://example.org/docs/watch)).\n"
    "3. Restart once, then edits apply on their own.\n\n"
    "```python\n"
    "def reload() -> None:\n"
    "    load_config.cache_clear()\n"
    "    return load_config(PATH)\n"
    "```\n\n"
    "- Keep the _old_ file around until the new one parses.\n"
    "- Log each reload with the path and the time it took.\n\n"
    "That should cover it; tell me if you want the watcher written out in full."
)
CHUNK_CHARS = 4
SLACK_SECRET = "bench-signing-secret"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---- the gateway process ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class GatewayProcess:
    """`python -m gateway serve` with a config file; CPU and memory read from /proc."""

    def __init__(self, config: Path, port: int, log: Path, secrets: dict[str, str] | None = None):
        self.config, self.port, self.log = config, port, log
        self.secrets = secrets or {}  # secrets come from the environment only
        self.proc: asyncio.subprocess.Process | None = None
        self.cpu_at_ready = 0.0  # CPU seconds the start took (less disturbed by load than wall time)

    async def start(self) -> float:
        """Spawn and wait for /readyz to say 200; returns the seconds that took."""
        overriding = ("GATEWAY_", "TELEGRAM_", "SLACK_", "LLM_", "OPENAI_")  # would override the config file
        env = {k: v for k, v in os.environ.items() if not k.startswith(overriding)}
        env["PYTHONPATH"] = str(ROOT)
        env.update(self.secrets)
        started = time.perf_counter()
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--config", str(self.config), "--log-level", "warning",
            cwd=str(self.config.parent), env=env, stdout=self.log.open("ab"), stderr=asyncio.subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{self.port}/readyz"
        async with aiohttp.ClientSession() as http:
            while True:
                if self.proc.returncode is not None:
                    raise RuntimeError(f"gateway exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
                try:
                    async with http.get(url) as response:
                        if response.status == 200:
                            self.cpu_at_ready = self.cpu_seconds()
                            return time.perf_counter() - started
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.005)
                if time.perf_counter() - started > 60:
                    raise RuntimeError(f"gateway not ready after 60 s; see {self.log}")

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime, all threads

    def memory_mb(self) -> tuple[float, float]:
        """(current RSS, peak RSS) in MB."""
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        value = lambda key: int(re.search(rf"^{key}:\s+(\d+)", status, re.M).group(1)) / 1024  # noqa: E731
        return value("VmRSS"), value("VmHWM")

    async def metrics(self) -> dict[str, float]:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{self.port}/metrics") as response:
                text = await response.text()
        found = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                found[name] = float(value)
        return found

    async def stop(self) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        return self.proc.returncode or 0


def write_config(directory: Path, database: str, llm_url: str, port: int, *, telegram: dict[str, Any] | None = None,
                 slack: dict[str, Any] | None = None, inbox: dict[str, Any] | None = None,
                 serve: dict[str, Any] | None = None, pool: dict[str, Any] | None = None) -> Path:
    config: dict[str, Any] = {
        "database": {"url": database, **(pool or {})},
        "llm": {"base_url": llm_url, "model": "bench-model", "max_retries": 1},
        "agent": {"workspace": str(directory / "workspace")},
        "http": {"port": port},
        "serve": {"shutdown_grace": 5, **(serve or {})},
        "inbox": inbox or {},
        "access": {"dm_policy": "open", "group_policy": "open"},  # the load talks as people nobody listed
    }
    if telegram is not None:
        config["telegram"] = telegram
    if slack is not None:
        config["slack"] = slack
    path = directory / "config.yml"
    path.write_text(json.dumps(config, indent=2))  # JSON is YAML
    return path


@contextlib.asynccontextmanager
async def database_url(kind: str, directory: Path) -> AsyncIterator[str]:
    """A fresh SQLite file, or a throwaway PostgreSQL database."""
    if kind == "sqlite":
        yield f"sqlite:///{directory / 'gateway.db'}"
        return
    import asyncpg

    base = postgres_url()
    dsn = base.replace("postgresql+asyncpg://", "postgresql://")
    name = f"bench_{uuid.uuid4().hex[:10]}"
    conn = await asyncpg.connect(dsn)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    try:
        yield base.rsplit("/", 1)[0] + "/" + name
    finally:
        conn = await asyncpg.connect(dsn)
        await conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await conn.close()


# ---- Telegram -----------------------------------------------------------------------------------


class LoadTelegram(FakeTelegram):
    """The fake Bot API, telling the driver when each chat received a message."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: Counter[int] = Counter()
        self.send_times: list[tuple[float, int]] = []  # (monotonic, chat) of every sendMessage
        self.paced_times: list[float] = []  # every call the bot's overall budget covers (drafts, typing too)
        self._waiters: dict[int, list[tuple[int, asyncio.Future[float]]]] = {}

    async def _api_sendMessage(self, params: dict[str, Any]) -> dict[str, Any]:
        result = await super()._api_sendMessage(params)
        chat, now = int(params["chat_id"]), time.perf_counter()
        self.sent[chat] += 1
        self.send_times.append((time.monotonic(), chat))
        self.paced_times.append(time.monotonic())
        waiting = self._waiters.get(chat, [])
        for entry in [w for w in waiting if w[0] <= self.sent[chat]]:
            waiting.remove(entry)
            if not entry[1].done():
                entry[1].set_result(now)
        return result

    async def _api_sendMessageDraft(self, params: dict[str, Any]) -> Any:
        self.paced_times.append(time.monotonic())
        return await super()._api_sendMessageDraft(params)

    async def _api_sendChatAction(self, params: dict[str, Any]) -> Any:
        self.paced_times.append(time.monotonic())
        return await super()._api_sendChatAction(params)

    async def _api_editMessageText(self, params: dict[str, Any]) -> Any:
        self.paced_times.append(time.monotonic())
        return await super()._api_editMessageText(params)

    def until_sent(self, chat: int, count: int) -> asyncio.Future[float]:
        """Resolves (with perf_counter time) when `chat` has received `count` messages."""
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        if self.sent[chat] >= count:
            future.set_result(time.perf_counter())
        else:
            self._waiters.setdefault(chat, []).append((count, future))
        return future


def telegram_section(fake: FakeTelegram, paced: bool) -> dict[str, Any]:
    section: dict[str, Any] = {"api_base_url": fake.base_url, "poll_timeout_s": 10}
    if not paced:
        section.update(rate_overall_per_s=0, rate_private_per_s=0, rate_group_per_min=0)
    return section


async def conversations(
    fake: LoadTelegram, chats: list[int], messages: int, text: str, timeout: float
) -> tuple[float, list[float]]:
    """Each chat sends a message, waits for the reply, sends the next; `messages` in all."""
    latencies: list[float] = []
    per_chat = [messages // len(chats) + (1 if n < messages % len(chats) else 0) for n in range(len(chats))]

    async def person(chat: int, count: int) -> None:
        for n in range(count):
            expected = fake.sent[chat] + 1
            started = time.perf_counter()
            fake.private_message(chat, f"{text} ({n})")
            shown = await asyncio.wait_for(fake.until_sent(chat, expected), timeout)
            latencies.append(shown - started)

    started = time.perf_counter()
    await asyncio.gather(*(person(chat, count) for chat, count in zip(chats, per_chat, strict=True)))
    return time.perf_counter() - started, latencies


def figures(label: str, cpu: float, elapsed: float, latencies: list[float], extra: str = "") -> str:
    n = len(latencies)
    return (f"{label:<22} {n:5d} {cpu * 1000 / n:9.2f} {n / elapsed:8.1f} {statistics.median(latencies) * 1000:8.1f} "
            f"{percentile(latencies, 95) * 1000:8.1f}{extra}")


# The goals (issue 45): a tenth of the peer's CPU per message, measured side by side in one run
# (bench/peer.py: nanobot-ai on the same fakes and workload), and ready in half a second.
RATIO_GOAL = 10.0
COLD_START_GOAL = 500.0
CASES = ("plain", "one tool call")
MESSAGES = (("plain", "what does load_config do"), ("one tool call", f"{TOOL_TRIGGER} and tell me"))


def print_against_goals(results: dict[str, dict[str, float]], theirs: dict[str, float]) -> None:
    """The steady figures of every database measured, beside the peer's measured in this run,
    the ratios and the goals."""
    kinds = list(results)
    print(f"\n== against the goals (commit {commit()}; load average {load_average():.1f}) ==")
    print(f"{'':<34} {'nanobot':>9}" + "".join(f" {kind:>9}" for kind in kinds) + f" {'goal':>9}")
    show = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
    for case in CASES:
        ours = [results[kind].get(case) for kind in kinds]
        label = f"CPU ms per message, {case}"
        print(f"{label:<34} {show(theirs.get(case)):>9}" + "".join(f" {show(v):>9}" for v in ours))
        ratios = [theirs[case] / v if case in theirs and v else None for v in ours]
        met = all(r is not None and r >= RATIO_GOAL for r in ratios)
        print(f"{'  peer / ours':<34} {'':>9}" + "".join(f" {show(r):>9}" for r in ratios)
              + f" {'>= ' + format(RATIO_GOAL, 'g'):>9}  {'met' if met else 'NOT MET'}"
              + ("" if theirs else " (the peer was not run: python3 bench/peer.py install)"))
    ours = [results[kind].get("cold start") for kind in kinds]
    met = all(v is not None and v <= COLD_START_GOAL for v in ours)
    print(f"{'cold start to /readyz ms (p50)':<34} {'-':>9}" + "".join(f" {show(v):>9}" for v in ours)
          + f" {'<= ' + format(COLD_START_GOAL, 'g'):>9}  {'met' if met else 'NOT MET'}")


async def peer_steady(args: argparse.Namespace) -> dict[str, float]:
    """The peer's CPU per message (ms) on the same fakes, messages and chats as `steady`."""
    print(f"\n== steady, the peer: nanobot-ai {peer.NANOBOT} ({args.messages} messages over {args.chats} private "
          f"chats, each waiting for its reply) ==")
    result: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        async with LLMProcess(CHUNK_CHARS, reply=REPLY, tool=peer.TOOL) as llm, LoadTelegram() as fake:
            nanobot = peer.NanobotProcess(directory, fake, llm.base_url, free_port())
            ready = await nanobot.start()
            try:
                started = time.perf_counter()
                fake.private_message(1, "hello")
                first_reply = await asyncio.wait_for(fake.until_sent(1, 1), 60) - started
                print(f"start to its first long poll: {ready * 1000:.0f} ms; first reply: {first_reply * 1000:.0f} ms")
                print(f"{'case':<22} {'msgs':>5} {'cpu ms/msg':>9} {'msg/s':>8} {'p50 ms':>8} {'p95 ms':>8}")
                base = 100
                for case, text in MESSAGES:
                    chats = list(range(base, base + args.chats))
                    base += 1000
                    cpu = nanobot.cpu_seconds()
                    elapsed, latencies = await conversations(fake, chats, args.messages, text, args.timeout)
                    cpu = nanobot.cpu_seconds() - cpu
                    print(figures(case, cpu, elapsed, latencies))
                    result[case] = cpu * 1000 / len(latencies)
            finally:
                await nanobot.stop()
    return result


async def steady(kind: str, args: argparse.Namespace) -> dict[str, float]:
    """The cold start and the CPU per message of each case (ms), also printed."""
    result: dict[str, float] = {}
    print(f"\n== steady: {args.messages} messages over {args.chats} private chats, each waiting for its reply "
          f"({kind}, pacing {'on' if args.paced else 'off'}) ==")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        async with LLMProcess(CHUNK_CHARS, reply=REPLY) as llm, LoadTelegram() as fake, \
                database_url(kind, directory) as db:
            port = free_port()
            config = write_config(directory, db, llm.base_url, port, telegram=telegram_section(fake, args.paced))
            gateway = GatewayProcess(config, port, directory / "gateway.log", {"TELEGRAM_BOT_TOKEN": fake.token})
            first = await gateway.start()  # creates the schema
            await gateway.stop()
            cold, cold_cpu = [], []
            for _ in range(args.cold_starts):
                cold.append(await gateway.start())
                cold_cpu.append(gateway.cpu_at_ready)
                await gateway.stop()
            gateway = GatewayProcess(config, port, directory / "gateway.log", {"TELEGRAM_BOT_TOKEN": fake.token})
            cold.append(await gateway.start())
            cold_cpu.append(gateway.cpu_at_ready)
            try:
                started = time.perf_counter()
                fake.private_message(1, "hello")
                first_reply = await asyncio.wait_for(fake.until_sent(1, 1), 30) - started
                print(f"cold start to /readyz: p50 {statistics.median(cold) * 1000:.0f} ms over {len(cold)} starts "
                      f"(min {min(cold) * 1000:.0f}, max {max(cold) * 1000:.0f}; the first start, creating the schema: "
                      f"{first * 1000:.0f} ms); CPU until ready p50 {statistics.median(cold_cpu) * 1000:.0f} ms; "
                      f"first reply after ready: {first_reply * 1000:.0f} ms")
                result["cold start"] = statistics.median(cold) * 1000
                print(f"{'case':<22} {'msgs':>5} {'cpu ms/msg':>9} {'msg/s':>8} {'p50 ms':>8} {'p95 ms':>8} "
                      f"{'stmts/msg':>10} {'txns/msg':>8}")
                base = 100
                for case, text in MESSAGES:
                    chats = list(range(base, base + args.chats))
                    base += 1000
                    before = await gateway.metrics()
                    profiler = await start_profiler(gateway, args.profile, case) if args.profile else None
                    cpu = gateway.cpu_seconds()
                    elapsed, latencies = await conversations(fake, chats, args.messages, text, args.timeout)
                    cpu = gateway.cpu_seconds() - cpu
                    if profiler is not None:
                        await stop_profiler(profiler)
                    after = await gateway.metrics()
                    per_message = {name: (after[name] - before[name]) / len(latencies)
                                   for name in ("gateway_db_statements_total", "gateway_db_transactions_total")}
                    extra = (f" {per_message['gateway_db_statements_total']:10.1f} "
                             f"{per_message['gateway_db_transactions_total']:8.1f}")
                    print(figures(case, cpu, elapsed, latencies, extra))
                    result[case] = cpu * 1000 / len(latencies)
                    missing = [c for c in chats if fake.sent[c] != args.messages // args.chats]
                    if missing:
                        print(f"  !! chats with a wrong reply count: {missing[:5]}")
                rss, peak = gateway.memory_mb()
                print(f"RSS {rss:.0f} MB, peak {peak:.0f} MB")
            finally:
                code = await gateway.stop()
                if code:
                    print(f"  !! gateway exited with {code}; see its log")
    return result


async def start_profiler(gateway: GatewayProcess, prefix: str, case: str) -> asyncio.subprocess.Process:
    """py-spy (installed by hand, not a project dependency) sampling the gateway, collapsed
    stacks written to `<prefix>-<case>.txt` (see bench/profile_summary.py)."""
    assert gateway.proc is not None
    output = f"{prefix}-{case.replace(' ', '-')}.txt"
    spy = str(Path(sys.executable).with_name("py-spy"))
    process = await asyncio.create_subprocess_exec(
        spy, "record", "--format", "raw", "--rate", "200", "--pid", str(gateway.proc.pid), "--output", output,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )
    await asyncio.sleep(0.5)  # attached
    return process


async def stop_profiler(process: asyncio.subprocess.Process) -> None:
    process.send_signal(signal.SIGINT)
    await process.wait()


# ---- a thousand turns in flight ----------------------------------------------------------------


def busiest(times: list[float], window: float) -> int:
    """The most sends within any `window` seconds (times sorted)."""
    most, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - window:
            j += 1
        most = max(most, i - j + 1)
    return most


def pacing_report(sends: list[tuple[float, int]], paced: list[float] | None = None) -> str:
    """The busiest second and five seconds overall and the busiest second per chat, against
    Telegram's limits (about 30 messages a second, 1 a second per chat; the pacer allows 30 in
    any second overall and a chat's token bucket a burst of 3 on top of its rate)."""
    times = sorted(t for t, _ in sends)
    one, five = busiest(times, 1.0), busiest(times, 5.0)
    per_chat: dict[int, list[float]] = {}
    for t, chat in sends:
        per_chat.setdefault(chat, []).append(t)
    chat_busiest = 0
    for stamps in per_chat.values():
        stamps.sort()
        for i in range(len(stamps)):
            chat_busiest = max(chat_busiest, sum(1 for s in stamps[i:] if s - stamps[i] < 1.0))
    every = busiest(sorted(paced), 1.0) if paced else 0
    verdict = "within limits" if five <= 150 and one <= 30 and every <= 30 and chat_busiest <= 3 else "OVER THE LIMITS"
    return (f"sendMessage: busiest second {one}, busiest 5 s {five} ({five / 5:.1f}/s; limit 30 in any second), "
            f"busiest chat-second {chat_busiest} (burst 3)"
            f"{f'; with drafts, typing and edits: busiest second {every}' if paced else ''}: {verdict}")


def commit() -> str:
    """The commit measured (with "+changes" when the tree differs from it)."""
    run = lambda *cmd: subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True).stdout.strip()  # noqa: E731
    head = run("git", "rev-parse", "--short", "HEAD") or "unknown"
    return head + ("+changes" if run("git", "status", "--porcelain", "--untracked-files=no") else "")


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


class ConnectionCounter:
    """PostgreSQL backends connected to the run's database, per application name (the gateway
    names its connections "gateway <instance id>"), sampled every `every` seconds."""

    def __init__(self, url: str, every: float = 1.0) -> None:
        self.dsn = url.replace("postgresql+asyncpg://", "postgresql://")
        self.database = url.rsplit("/", 1)[1]
        self.every = every
        self.peak: Counter[str] = Counter()  # the most connections each name held at once
        self.peak_total = 0
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> ConnectionCounter:
        import asyncpg

        self._conn = await asyncpg.connect(self.dsn)
        self._task = asyncio.create_task(self._sample())
        return self

    async def _sample(self) -> None:
        query = ("SELECT application_name, count(*) FROM pg_stat_activity "
                 "WHERE datname = $1 AND pid <> pg_backend_pid() GROUP BY application_name")
        while True:
            rows = await self._conn.fetch(query, self.database)
            for name, count in rows:
                self.peak[name] = max(self.peak[name], count)
            self.peak_total = max(self.peak_total, sum(count for _, count in rows))
            await asyncio.sleep(self.every)

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._conn.close()


async def thousand(kind: str, args: argparse.Namespace) -> None:
    """`--turns` private chats at once over `--instances` `gateway serve` processes on one
    database (more than one: PostgreSQL), each turn streaming a chunk every 50 ms for 10 s."""
    chats, instances, seconds = args.turns, args.instances, 10.0
    if instances > 1 and kind != "postgres":
        print(f"\n== {chats} turns over {instances} instances: skipped on {kind} (several need PostgreSQL) ==")
        return
    chunks = int(seconds / 0.05)
    reply = (REPLY * 2)[: chunks * CHUNK_CHARS]
    slots = args.slots or -(-chats // instances) + 50
    pool = {k: v for k, v in (("pool_size", args.pool_size), ("max_overflow", args.max_overflow)) if v is not None}
    print(f"\n== {chats} turns in flight over {instances} instance{'s' * (instances > 1)}: "
          f"each streams {chunks} chunks, one every 50 ms ({kind}; commit {commit()}; "
          f"max_concurrent_turns {slots} per instance{', pool ' + str(pool) if pool else ''}) ==")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            # One fake LLM process per instance: a single one fell behind a thousand streams.
            llms = [await stack.enter_async_context(LLMProcess(CHUNK_CHARS, delay=0.05, reply=reply))
                    for _ in range(instances)]
            fake = await stack.enter_async_context(LoadTelegram())
            db = await stack.enter_async_context(database_url(kind, directory))
            gateways = []
            for n, llm in enumerate(llms):
                home = directory / f"instance-{n}"
                home.mkdir()
                port = free_port()
                config = write_config(home, db, llm.base_url, port, telegram=telegram_section(fake, True),
                                      inbox={"max_concurrent_turns": slots}, serve={"instance_id": f"bench-{n}"},
                                      pool=pool)
                gateway = GatewayProcess(config, port, home / "gateway.log", {"TELEGRAM_BOT_TOKEN": fake.token})
                gateways.append(gateway)
                await gateway.start()  # in turn: the first creates the schema and leads
            counter = await stack.enter_async_context(ConnectionCounter(db)) if kind == "postgres" else None
            try:
                await drive_turns(fake, gateways, chats, args, counter)
            finally:
                for gateway in gateways:
                    await gateway.stop()


async def drive_turns(fake: LoadTelegram, gateways: list[GatewayProcess], chats: int, args: argparse.Namespace,
                      counter: ConnectionCounter | None) -> None:
    profiler = await start_profiler(gateways[0], args.profile, "thousand") if args.profile else None
    cpu = [gateway.cpu_seconds() for gateway in gateways]
    loads = [load_average()]
    started = time.perf_counter()
    waits = []
    for n in range(chats):
        chat = 10_000 + n
        fake.private_message(chat, f"tell me a long story ({n})")
        waits.append(fake.until_sent(chat, 1))
    samples: list[list[dict[str, float]]] = [[] for _ in gateways]
    peaks = [0.0 for _ in gateways]

    async def sample() -> None:
        while True:
            await asyncio.sleep(5)
            loads.append(load_average())
            for n, gateway in enumerate(gateways):
                samples[n].append(await gateway.metrics())
                peaks[n] = max(peaks[n], gateway.memory_mb()[1])

    sampler = asyncio.create_task(sample())
    # A floor for the deadline: Telegram's 30 messages a second for the bot send `chats` replies
    # in chats / 30 s at best.
    deadline = max(args.timeout + 60, chats / 10 + 120)
    try:
        times = await asyncio.wait_for(asyncio.gather(*waits), deadline)
    finally:
        sampler.cancel()
    elapsed = time.perf_counter() - started
    for n, gateway in enumerate(gateways):
        samples[n].append(await gateway.metrics())
    if profiler is not None:
        await stop_profiler(profiler)
    await asyncio.sleep(2.0)  # anything sent twice would arrive now
    cpu = [gateway.cpu_seconds() - before for gateway, before in zip(gateways, cpu, strict=True)]
    loads.append(load_average())
    latencies = [t - started for t in times]
    twice = [10_000 + n for n in range(chats) if fake.sent[10_000 + n] != 1]
    drafts = len(fake.calls_to("sendMessageDraft"))
    print(f"replies {len(times)}/{chats} ({'each exactly once' if not twice else f'NOT EXACTLY ONCE: {twice[:5]}'}) "
          f"in {elapsed:.1f} s; first reply at {min(latencies):.1f} s, median {statistics.median(latencies):.1f} s, "
          f"last at {max(latencies):.1f} s; {drafts} drafts")
    print(pacing_report(fake.send_times, fake.paced_times))
    total_cpu = sum(cpu)
    print(f"CPU {total_cpu * 1000 / chats:.1f} ms per streamed reply ({total_cpu:.1f} s in all); "
          f"machine load average {min(loads):.1f}-{max(loads):.1f} during the run")
    for n, gateway in enumerate(gateways):
        rss, peak = gateway.memory_mb()
        # Each sample's quantiles cover the 30 s before it: the worst window is reported.
        series = samples[n]
        p50 = max(s.get('gateway_event_loop_lag_seconds{quantile="0.5"}', float("nan")) for s in series)
        p99 = max(s.get('gateway_event_loop_lag_seconds{quantile="0.99"}', float("nan")) for s in series)
        worst = max(s.get("gateway_event_loop_lag_seconds_max", float("nan")) for s in series)
        label = f"instance {n}" if len(gateways) > 1 else "gateway"
        print(f"{label}: event-loop lag p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {worst * 1000:.1f} ms; "
              f"CPU {cpu[n]:.1f} s; RSS {rss:.0f} MB, peak {max(peak, peaks[n]):.0f} MB"
              f"{'' if counter is None else f'; PostgreSQL connections at most {counter.peak[gateway_name(n)]}'}")
    if counter is not None:
        others = {name: count for name, count in counter.peak.items()
                  if name not in {gateway_name(n) for n in range(len(gateways))}}
        print(f"PostgreSQL connections to the run's database: at most {counter.peak_total} at once"
              f"{f' (others: {dict(others)})' if others else ''}")


def gateway_name(n: int) -> str:
    return f"gateway bench-{n}"


# ---- Slack ----------------------------------------------------------------------------------------


def slack_replies(fake: Any, channel: str) -> int:
    """Finished bot replies in a channel (a native stream counts once it is stopped)."""
    mine = [m for m in fake.messages.get(channel, []) if m.get("user") == fake.bot_user_id]
    return sum(1 for m in mine if not m.get("streaming"))


async def slack(kind: str, args: argparse.Namespace) -> None:
    from fakes.slack import FakeSlack, SlackEventSender

    print(f"\n== Slack: HTTP events to /slack/events, {args.messages} DMs over {args.chats} channels, "
          f"each waiting for its reply ({kind}) ==")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        async with LLMProcess(CHUNK_CHARS, reply=REPLY) as llm, FakeSlack() as fake, \
                database_url(kind, directory) as db:
            port = free_port()
            section = {"api_base_url": fake.base_url, "send_interval_s": 0}
            config = write_config(directory, db, llm.base_url, port, slack=section)
            secrets = {"SLACK_BOT_TOKEN": fake.token, "SLACK_SIGNING_SECRET": SLACK_SECRET}
            gateway = GatewayProcess(config, port, directory / "gateway.log", secrets)
            await gateway.start()
            url = f"http://127.0.0.1:{port}/slack/events"
            try:
                async with SlackEventSender(url, SLACK_SECRET) as events:
                    cpu = gateway.cpu_seconds()
                    elapsed, latencies, post_times = await slack_conversations(events, fake, args)
                    cpu = gateway.cpu_seconds() - cpu
                    print(f"{'case':<22} {'msgs':>5} {'cpu ms/msg':>9} {'msg/s':>8} {'p50 ms':>8} {'p95 ms':>8}")
                    print(figures("slack DM reply", cpu, elapsed, latencies,
                                  f"   POST /slack/events p50 {statistics.median(post_times) * 1000:.1f} ms"))
                    accepted, took = await slack_intake(events, 1000)
                print(f"events accepted at /slack/events: {accepted / took:.0f}/s "
                      "(1,000 signed mentions, 20 in flight, "
                      f"while the gateway answers them)")
            finally:
                await gateway.stop()


async def slack_conversations(events: Any, fake: Any, args: argparse.Namespace):
    latencies: list[float] = []
    post_times: list[float] = []
    channels = [f"D{n:08d}" for n in range(args.chats)]
    per_chat = args.messages // args.chats

    async def person(channel: str) -> None:
        for n in range(per_chat):
            expected = slack_replies(fake, channel) + 1
            started = time.perf_counter()
            reply = await events.event(events.dm(channel, "U1", f"what does load_config do ({n})"))
            assert reply.status == 200, reply.status
            post_times.append(time.perf_counter() - started)
            await fake.wait_for(lambda wanted=expected: slack_replies(fake, channel) >= wanted, args.timeout)
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(person(c) for c in channels))
    return time.perf_counter() - started, latencies, post_times


async def slack_intake(events: Any, count: int) -> tuple[int, float]:
    mentions = [events.mention("C0BENCH", "U1", f"<@UBOT> question {n}") for n in range(count)]
    bodies = [json.dumps(events.envelope(mention)) for mention in mentions]
    accepted = 0

    async def poster() -> None:
        nonlocal accepted
        while bodies:
            reply = await events.post(bodies.pop())
            accepted += reply.status == 200

    started = time.perf_counter()
    await asyncio.gather(*(poster() for _ in range(20)))
    return accepted, time.perf_counter() - started


async def main(args: argparse.Namespace) -> None:
    kinds = ["sqlite", "postgres"] if args.db == "both" else [args.db]
    if "postgres" in kinds and not postgres_url():
        print("note: PostgreSQL skipped: GATEWAY_TEST_POSTGRES_URL is not set")
        kinds.remove("postgres")
    scenarios = {"thousand": thousand, "slack": slack}
    steady_results: dict[str, dict[str, float]] = {}
    for kind in kinds:
        for name in args.only.split(","):
            if name == "steady":
                steady_results[kind] = await steady(kind, args)
            else:
                await scenarios[name](kind, args)
    peer_results: dict[str, float] = {}
    if steady_results and args.peer == "on":
        peer_results = await peer_steady(args)
    elif steady_results and args.peer == "auto" and peer.python() is not None:
        peer_results = await peer_steady(args)
    if steady_results:
        print_against_goals(steady_results, peer_results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="sqlite")
    parser.add_argument("--only", default="steady,thousand,slack", help="comma-separated: steady, thousand, slack")
    parser.add_argument("--chats", type=int, default=20)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--turns", type=int, default=1000, help="turns in flight in `thousand`")
    parser.add_argument("--instances", type=int, default=1,
                        help="`gateway serve` processes sharing the database in `thousand` (more than one: PostgreSQL)")
    parser.add_argument("--slots", type=int, default=0,
                        help="inbox.max_concurrent_turns per instance in `thousand` (default: its share + 50)")
    parser.add_argument("--pool-size", type=int, help="database.pool_size of each instance (default: the gateway's)")
    parser.add_argument("--max-overflow", type=int, help="database.max_overflow of each instance")
    parser.add_argument("--cold-starts", type=int, default=4, help="extra restarts measured for the cold start")
    parser.add_argument("--paced", action="store_true",
                        help="Telegram pacing on in `steady` (default off: raw capacity)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for one reply")
    parser.add_argument("--profile", metavar="PREFIX",
                        help="sample the gateway with py-spy during `steady` and `thousand` "
                        "(collapsed stacks to PREFIX-<case>.txt)")
    parser.add_argument("--quick", action="store_true", help="60 messages, 100 turns in flight")
    parser.add_argument("--peer", choices=["auto", "on", "off"], default="auto",
                        help="run the peer (nanobot-ai, bench/peer.py) in `steady` too: auto when it is installed")
    parsed = parser.parse_args()
    if parsed.quick:
        parsed.messages, parsed.turns, parsed.cold_starts = 60, 100, 2
    # The bytecode `make install` and `make run` compile ahead, so a start measures no compiling.
    packages = (str(ROOT / name) for name in ("gateway", "channels", "scheduler"))
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=True)
    asyncio.run(main(parsed))
