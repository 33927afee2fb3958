"""The embedded default's fault drill: ONE `gateway serve` on SQLite, its data directory on a small
disk of its own (an ext4 image on a loop device, tests/small_disk.py), under kill -9s and disk faults.

    .venv/bin/python bench/chaos_sqlite.py        # --messages 400 --threads 12 (needs root)

What runs is chaos.py's (the fake Bot API with 429s and timeouts after delivering, signed Slack
events, the fake LLM in its own process with 500s, 429s and cut streams, approvals tapped, pairing,
an every-minute job), against one instance, with these faults one after another:
- `kill -9` at random points under load, timed: right after a new Telegram update or Slack event
  is handed over (inside the write that stores it), on a stream's edit (while a streamed reply is
  being recorded), and on the database file changing (in WAL mode only a checkpoint writes it);
  the process is restarted after each;
- the disk filling up (a file takes every free block) for `--fault-s`, then freed;
- another process holding a read transaction open for `--fault-s` (checkpoints cannot finish),
  and one holding the write lock (BEGIN IMMEDIATE) for 5 s;
- `gateway backup` while it serves (SQLite's online backup);
- the database, its WAL and its folder made immutable (`chattr +i`: read-only) for `--fault-s`, then back.

Promises checked: no message lost (each is answered), no answer twice that is not a recorded
ambiguous send, order kept, approvals resolved; `PRAGMA integrity_check` ok after every fault;
during a full or read-only disk /readyz says not ready with the reason, and after it the gateway
takes writes again by itself (the same process, no restart) and answers what came meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests", ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import chaos  # noqa: E402
from chaos import (  # noqa: E402
    Conversation,
    Drill,
    Instance,
    drill_users,
    free_port,
    instance_config,
    llm_faults,
    quiescent,
    report,
    start_llm,
)
from drill_checks import delivery_promises  # noqa: E402
from fakes.slack import SIGNING_SECRET, FakeSlack  # noqa: E402
from fakes.telegram import FakeTelegram  # noqa: E402
from small_disk import SmallDisk  # noqa: E402

GATEWAY = chaos.GATEWAY
WRITER_LOCK_S = 5.0


@dataclass
class Fault:
    kind: str  # kill:<when> | disk-full | read-only | reader | writer-lock | backup
    at: float
    seconds: float = 0.0
    integrity: str = ""
    detail: dict[str, Any] = field(default_factory=dict)


class SQLiteDrill(Drill):
    """chaos.py's users, watcher and report, one instance, the faults above."""

    def __init__(self, args: argparse.Namespace, tg: FakeTelegram, slack: FakeSlack, instance: Instance,
                 disk: SmallDisk, tmp: Path):
        super().__init__(args, tg, slack, [instance])
        self.instance = instance
        self.disk = disk
        self.tmp = tmp
        self.database = disk.data / "gateway.db"
        self.faults: list[Fault] = []
        self.readiness: list[tuple[float, int, str]] = []  # (time, status, database_fault)
        self.handed: asyncio.Event = asyncio.Event()  # a message was just handed to the gateway

    def planned_s(self) -> float:
        return self.args.plan_s

    def build(self) -> None:
        super().build()
        self.talking: list[asyncio.Task[None]] = []

    async def talk_during_fault(self, until: asyncio.Event) -> None:
        """New conversations (a Telegram group, a Slack thread) that talk only while the disk
        refuses writes, a message every 1.5 s each, so that each such fault meets new messages."""
        n = len(self.faults)
        admin = next(c for c in self.conversations if c.kind == "tg_private" and c.role == "admitted")
        in_slack = next(c for c in self.conversations if c.kind == "slack")
        probes = [
            Conversation(f"tg:{-9000 - n}", "tg_group", -9000 - n, admin.user),
            Conversation(f"{in_slack.key}:fault{n}", "slack", in_slack.chat, in_slack.user),
        ]
        self.conversations += probes
        while not until.is_set():
            for conversation in probes:
                posting = [t for t in self.talking if not t.done() and t.get_name() == conversation.key]
                if posting:  # a Slack post is retried until taken: the next one waits for it (order)
                    continue
                sent = self.new_text(conversation)
                sent.tool = False
                task = asyncio.create_task(self.send(conversation, sent), name=conversation.key)
                self.talking.append(task)
            await asyncio.sleep(1.5)

    async def send(self, conversation: Any, sent: Any) -> None:
        await super().send(conversation, sent)
        self.handed.set()

    # -- watching /readyz --
    async def watch_ready(self) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=2) as http:
            while not self.done.is_set():
                try:
                    page = await http.get(f"http://127.0.0.1:{self.instance.port}/readyz")
                    body = page.json()
                    self.readiness.append((time.monotonic(), page.status_code, str(body.get("database_fault") or "")))
                except (httpx.HTTPError, ValueError):
                    self.readiness.append((time.monotonic(), 0, ""))
                await asyncio.sleep(0.25)

    def integrity(self) -> str:
        conn = sqlite3.connect(f"{self.database.as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            return ",".join(row[0] for row in conn.execute("PRAGMA integrity_check"))
        finally:
            conn.close()

    # -- the faults --
    async def run_faults(self) -> None:
        plan = ["kill:random", "kill:handed", "disk-full", "kill:stream", "reader", "writer-lock", "backup",
                "kill:checkpoint", "read-only", "kill:random", "kill:handed", "disk-full"]
        plan = plan[: self.args.faults] if self.args.faults else plan
        await asyncio.sleep(8)
        for kind in plan:
            if self.done.is_set():
                return
            if kind.startswith("kill:"):
                await self.kill(kind.split(":", 1)[1])
            elif kind == "disk-full":
                await self.disk_fault(kind, self.disk.fill, self.disk.free)
            elif kind == "read-only":
                await self.disk_fault(kind, lambda: self.disk.read_only(self.database), self.disk.writable)
            elif kind == "reader":
                await self.hold(kind, "BEGIN; SELECT count(*) FROM inbox;", self.args.fault_s)
            elif kind == "writer-lock":
                await self.hold(kind, "BEGIN IMMEDIATE;", WRITER_LOCK_S)
            elif kind == "backup":
                await self.backup()
            await asyncio.sleep(self.rng.uniform(6, 10))

    async def kill(self, when: str) -> None:
        at = time.monotonic()
        if when == "handed":
            self.handed.clear()
            try:
                await asyncio.wait_for(self.handed.wait(), 30)
            except TimeoutError:
                when = "random (nothing was handed over for 30 s)"
            await asyncio.sleep(self.rng.uniform(0, 0.03))
        elif when == "stream":
            await self.until_call(("editMessageText", "sendMessageDraft", "chat.appendStream", "chat.update"))
        elif when == "checkpoint":
            await self.until_file_changes()
        self.instance.kill()
        await self.instance.proc.wait()  # type: ignore[union-attr]
        waited = round(time.monotonic() - at, 2)
        fault = Fault(f"kill:{when}", time.monotonic(), detail={"waited for its moment s": waited})
        fault.integrity = await asyncio.to_thread(self.integrity)  # the file as the kill left it
        self.faults.append(fault)
        self.kills += 1
        self.events.append((time.monotonic(), "kill", self.instance.name))
        await asyncio.sleep(self.rng.uniform(0.5, 1.5))
        await self.instance.start()
        await chaos.wait_ready([self.instance])
        self.events.append((time.monotonic(), "restart", self.instance.name))

    async def until_call(self, methods: tuple[str, ...], limit_s: float = 30) -> None:
        """Until the fake Bot API or Slack sees a new call of one of `methods` (a stream's edit)."""
        def count() -> int:
            return sum(1 for c in self.tg.calls if c.method in methods) + sum(
                1 for c in self.slack.calls if c.method in methods
            )

        seen, deadline = count(), time.monotonic() + limit_s
        while count() == seen and time.monotonic() < deadline:
            await asyncio.sleep(0.005)

    async def until_file_changes(self, limit_s: float = 60) -> None:
        """Until the database file itself is written: in WAL mode, by a checkpoint."""
        before, deadline = os.stat(self.database).st_mtime_ns, time.monotonic() + limit_s
        while os.stat(self.database).st_mtime_ns == before and time.monotonic() < deadline:
            await asyncio.sleep(0.002)

    async def disk_fault(self, kind: str, start: Any, end: Any) -> None:
        """The disk full or read-only for `--fault-s`: /readyz must say so, and after it the same
        process must take writes again by itself."""
        pid, starts = self.instance.proc.pid, self.instance.starts  # type: ignore[union-attr]
        logged = self.instance.log.stat().st_size
        await asyncio.to_thread(start)
        began = time.monotonic()
        self.events.append((began, kind, self.instance.name))
        stop_talking = asyncio.Event()
        self.talking.append(asyncio.create_task(self.talk_during_fault(stop_talking)))
        refused = await self.refused_within(began, 45)  # the WAL's own room may take the first writes
        await asyncio.sleep(self.args.fault_s)
        stop_talking.set()
        await asyncio.to_thread(end)
        ended = time.monotonic()
        recovered = await self.ready_again(ended)
        said = sorted({why for at, status, why in self.readiness if began <= at <= ended and status == 503 and why})
        await asyncio.sleep(1)  # the lines of the recovery
        lines = self.instance.log.read_bytes()[logged:].decode(errors="replace").splitlines()
        loud = [line for line in lines if " WARNING " in line or " ERROR " in line]
        store = [line for line in loud if " gateway.store.db: the database" in line]
        fault = Fault(kind, began, ended - began, detail={
            "a write refused after s": None if refused is None else round(refused - began, 2),
            "/readyz said": said[:2],
            "ready again after the disk was back s": None if recovered is None else round(recovered - ended, 2),
            "restarted": self.instance.proc.pid != pid or self.instance.starts != starts,  # type: ignore[union-attr]
            "the log said": [line.split(" ", 3)[-1][:90] for line in store],
            "other warnings and errors meanwhile": [line.split(" ", 2)[-1][:160] for line in loud if line not in store],
            "tracebacks meanwhile": sum(1 for line in lines if line.startswith("Traceback")),
        })
        fault.integrity = await asyncio.to_thread(self.integrity)
        self.faults.append(fault)

    async def refused_within(self, since: float, limit_s: float) -> float | None:
        """When /readyz first said the disk refuses a write, since `since`."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            at = next((at for at, status, why in self.readiness if at > since and status == 503 and why), None)
            if at is not None:
                return at
            await asyncio.sleep(0.1)
        return None

    async def ready_again(self, since: float, limit_s: float = 60) -> float | None:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if any(at > since and status == 200 for at, status, _ in self.readiness):
                return next(at for at, status, _ in self.readiness if at > since and status == 200)
            await asyncio.sleep(0.1)
        return None

    async def hold(self, kind: str, sql: str, seconds: float) -> None:
        """Another process with the database open: a long read transaction, or the write lock."""
        began = time.monotonic()
        script = (
            "import sqlite3, sys, time\n"
            f"c = sqlite3.connect({str(self.database)!r}, isolation_level=None, timeout=30)\n"
            f"c.executescript({sql!r})\n"
            "print('held', flush=True)\n"
            f"time.sleep({seconds})\n"
            "c.execute('ROLLBACK')\n"
        )
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", script, stdout=asyncio.subprocess.PIPE)
        held = await proc.stdout.readline()  # type: ignore[union-attr]
        await proc.wait()
        fault = Fault(kind, began, time.monotonic() - began, detail={"held": held.strip() == b"held"})
        fault.integrity = await asyncio.to_thread(self.integrity)
        self.faults.append(fault)

    async def backup(self) -> None:
        began = time.monotonic()
        target = self.tmp / "backups"
        target.mkdir(exist_ok=True)
        proc = await asyncio.create_subprocess_exec(
            GATEWAY, "backup", str(target), "--config", str(self.instance.config), env=self.instance.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        copies = sorted(target.iterdir())
        checked = ""
        if copies:
            conn = sqlite3.connect(copies[-1])
            checked = conn.execute("PRAGMA integrity_check").fetchone()[0]
            conn.close()
        fault = Fault("backup", began, time.monotonic() - began, detail={
            "exit": proc.returncode, "line": out.decode(errors="replace").strip()[-200:],
            "the copy's integrity": checked,
        })
        fault.integrity = await asyncio.to_thread(self.integrity)
        self.faults.append(fault)


def sqlite_verdict(figures: dict[str, Any], drill: SQLiteDrill, args: argparse.Namespace) -> list[str]:
    disk_faults = [f for f in drill.faults if f.kind in ("disk-full", "read-only")]
    failed = {
        **delivery_promises(figures),
        "an integrity check not ok": any(f.integrity != "ok" for f in drill.faults),
        "a disk fault /readyz did not report": any(not f.detail["/readyz said"] for f in disk_faults),
        "a disk fault not recovered without a restart": any(
            f.detail["restarted"] or f.detail["ready again after the disk was back s"] is None for f in disk_faults
        ),
        "a disk fault not said in one line (and one when it ended)": any(
            len(f.detail["the log said"]) != 2 or f.detail["tracebacks meanwhile"] for f in disk_faults
        ),
        "a backup failed": any(f.detail.get("exit") != 0 for f in drill.faults if f.kind == "backup"),
        "a lock not held": any(not f.detail.get("held") for f in drill.faults if f.kind in ("reader", "writer-lock")),
        "fewer faults than planned": len(drill.faults) < (args.faults or 12),
    }
    return [what for what, bad in failed.items() if bad]


async def run(args: argparse.Namespace) -> int:
    from gateway.events import utcnow
    from gateway.store import Store, upgrade

    if SmallDisk.problem():
        print(f"the drill needs a small disk of its own: {SmallDisk.problem()}")
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="chaos-sqlite-"))
    llm_proc, llm_url = await start_llm()
    (tmp / "ws").mkdir()
    instance: Instance | None = None
    with SmallDisk(tmp, size_mb=args.disk_mb) as disk:
        url = f"sqlite:///{disk.data / 'gateway.db'}"
        store = Store(url)
        try:
            await upgrade(store.db)
            async with FakeTelegram() as tg, FakeSlack() as slack:
                tg.timeout_delay_s = 3.0
                tg.random_faults(("sendMessage", "editMessageText", "sendMessageDraft"), rate_429=0.02,
                                 retry_after=(1, 20), rate_timeout=0.01, seed=args.seed)
                tg.keep_flood_waits()
                env = {**os.environ, "GATEWAY_DATABASE_URL": url, "TELEGRAM_BOT_TOKEN": tg.token,
                       "SLACK_BOT_TOKEN": slack.token, "SLACK_SIGNING_SECRET": SIGNING_SECRET}
                env.pop("SLACK_APP_TOKEN", None)
                port = free_port()
                config = instance_config(tmp, "gw1", port, llm_url, tg, slack, drill_users(args.threads))
                instance = Instance("gw1", port, config, env, tmp / "gw1.log")
                await instance.start()
                await chaos.wait_ready([instance])
                drill = SQLiteDrill(args, tg, slack, instance, disk, tmp)
                drill.build()
                for sender in drill.senders:
                    await sender.__aenter__()
                started, started_at = time.monotonic(), utcnow()
                per_thread = args.messages // args.threads
                background = [asyncio.create_task(c) for c in (drill.watch(), drill.progress(), drill.watch_ready())]
                faults = asyncio.create_task(drill.run_faults())
                talks = [drill.user(c, per_thread if c.role == "admitted" else 3, started) for c in drill.conversations]
                await asyncio.gather(*talks)
                await faults
                await asyncio.gather(*drill.talking)
                await quiescent(store, [c.thread_key for c in drill.conversations if c.role == "stranger"])
                drill.quiet.set()
                await asyncio.sleep(3)
                drill.done.set()
                await asyncio.gather(*background)
                figures = await report(drill, store, started, await llm_faults(llm_proc), started_at)
                for sender in drill.senders:
                    await sender.__aexit__(None, None, None)
                await instance.stop()
                final = await asyncio.to_thread(drill.integrity)
        finally:
            await store.close()
            if instance is not None:
                instance.kill()
            if llm_proc.stdin is not None and not llm_proc.stdin.is_closing():
                llm_proc.stdin.close()
            await llm_proc.wait()
    keep = ("messages", "threads", "messages needing an approval", "lost", "answered twice",
            "answered twice, not explained by a recorded ambiguous send",
            "answered twice (each: its messages and outbox keys)",
            "order kept", "approvals resolved", "strangers' messages answered", "people paired during the run",
            "job firings", "telegram faults injected", "llm faults injected",
            "timed-out new messages not recorded uncertain", "outbox rows recorded uncertain",
            "outbox rows undelivered at the end", "latency message to reply p50 s", "latency message to reply p95 s",
            "slack deliveries refused by a dead instance (retried elsewhere)", "wall s", "lost markers",
            "threads out of order")
    shown = {k: figures[k] for k in keep if k in figures}
    shown["slack deliveries refused (a dead instance, a 503 while the disk refused writes), delivered again"] = (
        shown.pop("slack deliveries refused by a dead instance (retried elsewhere)", None)
    )
    shown["faults"] = [
        {"kind": f.kind, "seconds": round(f.seconds, 1), "integrity_check": f.integrity, **f.detail}
        for f in drill.faults
    ]
    shown["integrity_check at the end"] = final
    print(f"python bench/chaos_sqlite.py {' '.join(sys.argv[1:])}")
    print(json.dumps(shown, indent=2, default=str))
    print(f"logs: {tmp}")
    broken = sqlite_verdict(figures, drill, args) + ([] if final == "ok" else ["the final integrity check"])
    print("all promises held" if not broken else f"DOES NOT HOLD: {', '.join(broken)}")
    return 0 if not broken else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--threads", type=int, default=12)
    parser.add_argument("--tool-share", type=float, default=0.08, help="messages that need an approval")
    parser.add_argument("--fault-s", type=float, default=12.0, help="a full or read-only disk, a reader: seconds")
    parser.add_argument("--faults", type=int, default=0, help="only the first N faults of the plan (default: all 12)")
    parser.add_argument("--plan-s", type=float, default=240.0, help="how long the users keep talking")
    parser.add_argument("--disk-mb", type=int, default=64, help="the size of the data directory's disk")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--verbose", action="store_true", help="show the last messages of a few chats as it runs")
    parser.add_argument("--upgrade-from", default="", help=argparse.SUPPRESS)  # chaos.Drill reads it
    parser.add_argument("--kills", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, chaos._interrupted)
    random.seed(args.seed)
    return asyncio.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
