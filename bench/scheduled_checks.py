"""A simulated day of a 1-minute tick, without a check (every firing calls the model) and with a
check that finds something new at 5 moments only: model calls, firings and how each was
recorded, tokens, and the scheduler's own CPU for the day, side by side.

    .venv/bin/python bench/scheduled_checks.py                       # SQLite, and PostgreSQL when
    .venv/bin/python bench/scheduled_checks.py --minutes 240         #   GATEWAY_TEST_POSTGRES_URL is set
    .venv/bin/python bench/scheduled_checks.py --check url --backoff 30m

The gateway is the real one (inbox, turns, the model client) with the fake model server in a
child process (bench/support.py); the scheduler is the real one on a clock the benchmark holds
(`Scheduler(manual_clock=True)`): it runs each planned firing at its simulated time, one after
the other, so a day takes minutes. The check is the real probe (gateway/jobs/checks.py): by
default a command (`cat news.txt`) in the shell's sandbox, whose file the benchmark appends a
line to at the 5 moments; `--check url` is a GET of a local server (a child process) that
answers 304 to its ETag until the 5 moments. The "scheduler CPU" column is this process's CPU
time inside the firings (claim, check, record, session opened and prompt queued), waiting for
a woken turn's end outside them; "process CPU" adds the turns. `--backoff 30m` adds a third
column: the check with `idle_backoff: {max_every: 30m}`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from support import LLMProcess, bench_store, database_kinds  # noqa: E402

from gateway.app import Gateway  # noqa: E402
from gateway.config import Config, SchedulerConfig  # noqa: E402
from gateway.jobs.checks import JobChecks, job_dir  # noqa: E402
from gateway.llm import LLMClient  # noqa: E402
from gateway.running.lifecycle import run_main  # noqa: E402
from gateway.store import Store  # noqa: E402
from scheduler.definitions import job_config, to_schedule  # noqa: E402
from scheduler.jobs import Scheduler  # noqa: E402

JOB = "inbox-watch"
DAY_START = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)
NEWS_AT_MINUTES = (95, 402, 611, 903, 1307)  # the 5 moments the check finds something new
# An example price to put tokens in money: $0.15 per million input tokens, $0.60 per million output.
PRICE_IN, PRICE_OUT = 0.15e-6, 0.60e-6


def now_factory() -> tuple[list[datetime], Any]:
    moment = [DAY_START]
    return moment, lambda: moment[0]


@dataclass
class Column:
    name: str
    firings: int = 0
    model_calls: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    skipped_no_change: int = 0
    rows: int = 0
    distinct: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    scheduler_cpu: float = 0.0
    check_cpu: float = 0.0  # of which in the check's probe (the command's start and end, the GET)
    firing_wall: float = 0.0  # wall time inside the firings
    idle_rate: float = 0.0  # CPU seconds per second of the started gateway doing nothing (its loops)
    statements: int = 0  # database statements sent inside the firings
    transactions: int = 0
    process_cpu: float = 0.0
    wall: float = 0.0
    woke_late_min: list[float] = field(default_factory=list)  # minutes from the news to the woken firing


class NewsServer:
    """The url check's server, in a child process: ETag `v<n>` and 304 while nothing is new."""

    SCRIPT = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
version = [0]
class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/bump":
            version[0] += 1
            self.send_response(204); self.end_headers(); return
        etag = f'"v{version[0]}"'
        if self.headers.get("If-None-Match") == etag:
            self.send_response(304); self.send_header("ETag", etag); self.end_headers(); return
        body = "".join(f"mail {n}: the invoice is overdue\n" for n in range(1, version[0] + 1)).encode()
        self.send_response(200); self.send_header("ETag", etag)
        self.send_header("Content-Type", "text/plain"); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

    async def __aenter__(self) -> NewsServer:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", self.SCRIPT, stdout=asyncio.subprocess.PIPE
        )
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(await self.proc.stdout.readline())}/"
        import httpx

        self.http = httpx.AsyncClient()
        return self

    async def bump(self) -> None:
        (await self.http.get(self.url + "bump")).raise_for_status()

    async def __aexit__(self, *exc: object) -> None:
        await self.http.aclose()
        self.proc.kill()
        await self.proc.wait()


class TimedChecks(JobChecks):
    """The real probes, with the CPU this process spends in them counted."""

    cpu = 0.0

    async def probe(self, job: str, spec: dict[str, Any], state: Any) -> Any:
        started = time.process_time()
        try:
            return await super().probe(job, spec, state)
        finally:
            self.cpu += time.process_time() - started


def gateway_config(llm_url: str, workspace: Path, allow_private: bool) -> Config:
    return Config.model_validate({
        "llm": {"base_url": llm_url, "model": "bench-model", "max_retries": 0},
        "agent": {"workspace": str(workspace), "system_prompt": "You are a scheduled assistant.",
                  "http_fetch_allow_private": allow_private},
        "scheduler": {"enabled": False},  # the benchmark's own scheduler, on its own clock, fires the tick
        "access": {"dm_policy": "open", "group_policy": "open"},
    })


def job_fields(check: str | None, news: NewsServer | None, backoff: str | None) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "name": JOB, "kind": "tick", "every": "1m", "deliver_to": "none",
        "prompt": "Tell me only what is urgent in these unread mails.",
    }
    if check == "command":
        fields["check"] = {"command": "cat news.txt", "wake_when": "changed", "timeout": "10s"}
    elif check == "url":
        assert news is not None
        fields["check"] = {"url": news.url, "wake_when": "changed", "timeout": "10s"}
    if backoff:
        fields["idle_backoff"] = {"max_every": backoff}
    return fields


async def simulate(
    name: str, db: str, directory: Path, llm: LLMProcess, minutes: int, check: str | None, backoff: str | None
) -> Column:
    column = Column(name)
    workspace = directory / f"ws-{name.replace(' ', '-')}"
    async with bench_store(db, directory) as store, NewsServer() as news:
        config = gateway_config(llm.base_url, workspace, allow_private=check == "url")
        client = LLMClient(config.llm)
        gateway = Gateway(config, channels={}, serve_http=False, store=store, llm=client)
        await gateway.start()
        moment, now = now_factory()
        scheduler = Scheduler(
            store, SchedulerConfig(), submit=gateway.inbox.submit, deliver=gateway.deliver, now=now,
            manual_clock=True, checks=(checks := TimedChecks(config.agent)), read_checklist=gateway.checklists.read,
        )
        gateway.inbox.listeners.remove(gateway.scheduler.on_turn_ended)  # this scheduler closes the runs
        gateway.inbox.listeners.append(scheduler.on_turn_ended)
        try:
            new = to_schedule(job_config(job_fields(check, news, backoff)), SchedulerConfig(), source="cli",
                              now=DAY_START)
            schedule = await store.schedules.create(new, now=DAY_START)
            news_file = job_dir(config.agent, JOB) / "news.txt"
            news_file.write_text("")
            await scheduler.start()
            await llm.server_seconds()  # reset the fake's count
            idle_cpu, idle_wall = time.process_time(), time.perf_counter()
            await asyncio.sleep(5)  # the gateway's own loops, with nothing to do: subtracted below
            column.idle_rate = (time.process_time() - idle_cpu) / (time.perf_counter() - idle_wall)
            count = store.db.count
            end = DAY_START + timedelta(minutes=minutes)
            pending_news = [DAY_START + timedelta(minutes=m) for m in NEWS_AT_MINUTES if m < minutes]
            news_times: list[datetime] = []
            unseen: datetime | None = None  # the first news no woken firing has seen yet
            started, cpu_started = time.perf_counter(), time.process_time()
            while (due := scheduler.clock.next_due()) is not None and due[1] <= end:  # type: ignore[union-attr]
                when = due[1]
                while pending_news and pending_news[0] <= when:  # something new arrived before this firing
                    news_times.append(pending_news.pop(0))
                    unseen = unseen or news_times[-1]
                    with news_file.open("a") as handle:
                        handle.write(f"mail {len(news_times)}: the invoice is overdue\n")
                    await news.bump()
                moment[0] = when
                cpu, wall, statements, transactions = (
                    time.process_time(), time.perf_counter(), count.statements, count.transactions
                )
                await scheduler.clock.run_next()  # type: ignore[union-attr]
                column.scheduler_cpu += time.process_time() - cpu
                column.firing_wall += time.perf_counter() - wall
                column.statements += count.statements - statements
                column.transactions += count.transactions - transactions
                column.firings += 1
                [run] = await store.schedules.recent_runs(schedule.id, limit=1)
                if run.status == "running":  # woke: the turn runs now, outside the scheduler's time
                    if unseen is not None:
                        column.woke_late_min.append((when - unseen).total_seconds() / 60)
                        unseen = None
                    await gateway.inbox.wait_until_idle(60)
            column.wall = time.perf_counter() - started
            column.process_cpu = time.process_time() - cpu_started
            column.check_cpu = checks.cpu
            column.model_calls = len(await llm.server_seconds())
            rows = await store.schedules.recent_runs(schedule.id, limit=10_000)
            column.rows, column.distinct = len(rows), len({r.scheduled_for for r in rows})
            for row in rows:
                column.statuses[row.status] = column.statuses.get(row.status, 0) + 1
            column.skipped_no_change = sum(1 for r in rows if r.status == "skipped" and r.error == "no change")
            await tokens_of(store, column)
        finally:
            await scheduler.stop()
            await gateway.stop()
            await client.aclose()
    return column


async def tokens_of(store: Store, column: Column) -> None:
    for run in await store.runs.list(limit=10_000):
        column.input_tokens += run.input_tokens
        column.output_tokens += run.output_tokens
        column.cached_tokens += run.cached_tokens


def print_table(db: str, minutes: int, columns: list[Column]) -> None:
    def row(label: str, values: list[str]) -> None:
        print(f"  {label:<38}" + "".join(f"{v:>26}" for v in values))

    print(f"\n{db}: a simulated {minutes / 60:g} h of a 1-minute tick, news at {len(NEWS_AT_MINUTES)} moments")
    row("", [c.name for c in columns])
    row("model calls", [f"{c.model_calls:,}" for c in columns])
    row("firings", [f"{c.firings:,}" for c in columns])
    row("job_runs rows (distinct firings)", [f"{c.rows:,} ({c.distinct:,})" for c in columns])
    row("skipped (no change)", [f"{c.skipped_no_change:,}" for c in columns])
    row("statuses", [", ".join(f"{k} {v:,}" for k, v in sorted(c.statuses.items())) for c in columns])
    row("input tokens (cached)", [f"{c.input_tokens:,} ({c.cached_tokens:,})" for c in columns])
    row("output tokens", [f"{c.output_tokens:,}" for c in columns])
    cost = [c.input_tokens * PRICE_IN + c.output_tokens * PRICE_OUT for c in columns]
    row("cost at $0.15/$0.60 per M tokens", [f"${v:.4f}" for v in cost])
    row("scheduler CPU for the day", [f"{c.scheduler_cpu:.2f} s" for c in columns])
    row("  of which in the check's probe", [f"{c.check_cpu:.2f} s" for c in columns])
    row("  of which the idle gateway's loops", [f"{c.idle_rate * c.firing_wall:.2f} s" for c in columns])
    row("scheduler CPU net of the idle loops", [f"{net(c):.2f} s" for c in columns])
    row("scheduler CPU per firing (net)", [f"{net(c) / max(1, c.firings) * 1000:.2f} ms" for c in columns])
    row("statements / transactions per firing",
        [f"{c.statements / max(1, c.firings):.1f} / {c.transactions / max(1, c.firings):.1f}" for c in columns])
    row("process CPU (with the turns)", [f"{c.process_cpu:.2f} s" for c in columns])
    row("wall time of the simulation", [f"{c.wall:.1f} s" for c in columns])
    late = [f"{max(c.woke_late_min):.0f}" if c.woke_late_min else "-" for c in columns]
    row("news to the model (minutes, max)", late)


def net(column: Column) -> float:
    return max(0.0, column.scheduler_cpu - column.idle_rate * column.firing_wall)


def verdict(columns: list[Column], minutes: int) -> list[str]:
    without, checked = columns[0], columns[1]
    news = len([m for m in NEWS_AT_MINUTES if m < minutes])
    problems = []
    if without.model_calls != minutes:
        problems.append(f"without a check: {without.model_calls} model calls, expected {minutes}")
    if checked.model_calls != news:
        problems.append(f"with the check: {checked.model_calls} model calls, expected {news}")
    if checked.skipped_no_change != minutes - news:
        problems.append(f"with the check: {checked.skipped_no_change} skipped (no change), expected {minutes - news}")
    for column in columns:
        if column.rows != column.firings or column.distinct != column.firings:
            problems.append(f"{column.name}: {column.rows} rows for {column.firings} firings")
    if net(checked) * 1440 / minutes >= 2.0:
        problems.append(f"with the check: scheduler CPU {net(checked):.2f} s net (a day's goal: under 2 s)")
    return problems


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=1440, help="length of the simulated day (default 1440)")
    parser.add_argument("--check", choices=("command", "url"), default="command")
    parser.add_argument("--backoff", default="", help="add a column with idle_backoff max_every (e.g. 30m)")
    parser.add_argument("--db", nargs="+", default=["sqlite", "postgres"], choices=("sqlite", "postgres"))
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; {os.cpu_count()} CPUs")
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        async with LLMProcess(reply="NOTHING_TO_REPORT") as llm:
            for db in database_kinds(args.db):
                cases = [("without check", None, None), (f"with check ({args.check})", args.check, None)]
                if args.backoff:
                    cases.append((f"+ backoff {args.backoff}", args.check, args.backoff))
                columns = [
                    await simulate(name, db, Path(tmp), llm, args.minutes, check, backoff)
                    for name, check, backoff in cases
                ]
                print_table(db, args.minutes, columns)
                problems = verdict(columns, args.minutes)
                print("  verdict: " + ("; ".join(problems) if problems else "every goal met"))
                failed = failed or bool(problems)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run_main(main()))
