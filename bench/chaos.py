"""The fault drill: three `gateway serve` processes on one PostgreSQL, under faults and kill -9s.

    GATEWAY_TEST_POSTGRES_URL=postgresql+asyncpg://postgres@127.0.0.1:5432/test \\
        .venv/bin/python bench/chaos.py            # --messages 1000 --threads 50 --kills 10

What runs:
- a throwaway PostgreSQL database, migrated once;
- the fake Telegram Bot API (polled by whichever instance leads) answering 2% of sends and edits
  with 429 `retry_after` 1-40 s and 1% with a timeout after carrying them out;
- the fake Slack Web API, with signed HTTP events and button clicks spread over all three
  instances (a dead one is skipped, as a load balancer would, with Slack's retry header);
- a fake LLM in its own process: 50-500 ms per request, 5% HTTP 500, 2% 429 with Retry-After,
  1% a stream cut mid-way; it answers each message with its marker, and a message marked TOOL
  first asks for `write_file`, which needs an approval that the fake user taps;
- users on `--threads` conversations (Telegram private chats and groups, Slack threads), each
  sending its share of `--messages` in small bursts (busy mode `queue`: one turn per message);
- a killer: `kill -9` of a random instance `--kills` times (the leader at least 3 times),
  restarting it each time; `--stops` times an instance SIGSTOPped past the lease TTL, then
  continued (the stalled holder); `--db-restarts` times PostgreSQL stopped for 10 s, then started;
- what a deployment runs: Telegram's pacing (per chat and overall), pairing (two people paired
  by an admin's tap during the run, two strangers never), an every-minute job delivering into a
  busy chat under a job budget cap near its limit, documents attached to some messages, and the
  fake Bot API keeping each flood wait as Telegram does.

Then it reports, from what the fake chats show after all edits: messages lost, answered twice
(each answer matched to its outbox row by platform message id), per-thread order, approvals
resolved, ambiguous sends recorded, strangers answered, sends into a held chat, job firings
recorded once, the job's spend against its cap, latency from message to reply, leader failover
time and the time a thread waited after its instance died.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import yaml  # noqa: E402
from drill_checks import (  # noqa: E402
    answered_markers,
    delivery_promises,
    duplicates,
    job_firings,
    job_spend,
    outbox_by_message,
)
from drill_faults import database_restarter, patient, staller  # noqa: E402
from fakes.slack import SIGNING_SECRET, FakeSlack, SlackEventSender  # noqa: E402
from fakes.telegram import FakeTelegram  # noqa: E402

POSTGRES_ENV = "GATEWAY_TEST_POSTGRES_URL"
MARKER = re.compile(r"\bM\d{5}\b")
PAIRING_REQUEST = re.compile(r"Access request from .*\(telegram:(\d+)\)")
GATEWAY = str(ROOT / ".venv" / "bin" / "gateway")
PYTHON = str(ROOT / ".venv" / "bin" / "python")
LEASE_TTL_S = 6.0
# A 429 reaches the other instances through the database (a write, then a NOTIFY, then their
# read): a send another instance had under way within this long of the 429 could not have
# known. Telegram refuses it with a 429 of its own, and its sender holds the chat from then on.
HOLD_KNOWN_S = 0.25
ADMIN = 999  # the Telegram admin whose DM gets the pairing prompts (besides every drill user's)
PAIRED = (7100, 7101)  # strangers an admin approves during the run
STRANGERS = (7000, 7001)  # strangers nobody approves: never answered
JOB_CAP_TOKENS = 4_800  # the job's daily tokens: a worst-case reservation (~4,500) fits only while little is used
ATTACHMENT_SHARE = 0.05  # Telegram messages that carry a document


# ---- the fake LLM process --------------------------------------------------------------------


def chaos_responder(request: dict[str, Any], rng: random.Random, injected: dict[str, int]) -> Any:
    from fakes.llm import FakeToolCall, HttpError, Reply, Truncate

    roll = rng.random()
    if roll < 0.05:
        injected["500"] += 1
        return HttpError(500, {"error": {"message": "injected server error", "type": "server_error"}})
    if roll < 0.07:
        injected["429"] += 1
        return HttpError(429, {"error": {"message": "injected rate limit"}}, headers={"Retry-After": "1"})
    messages = request.get("messages", [])
    # The newest user message with a marker (context notes may come after it, and after the tool results).
    asked = max((n for n, m in enumerate(messages) if m.get("role") == "user" and MARKER.search(str(m.get("content")))),
                default=-1)
    last_user = messages[asked] if asked >= 0 else {}
    marker = (MARKER.findall(str(last_user.get("content") or "")) or ["M?????"])[-1]
    answered_tool = any(m.get("role") == "tool" for m in messages[asked + 1:])
    if roll < 0.08:
        injected["stream cut"] += 1
        # Cut mid-way: the turn finishes what was shown with a cut-off notice (never a second copy),
        # so this partial text is the message's one answer.
        return Truncate(f"Answer to {marker}: the fake model was saying")
    if "scheduled report JOB" in str(last_user.get("content") or ""):
        return Reply("Job report: all quiet.")
    if "TOOL" in str(last_user.get("content") or "") and not answered_tool:
        return Reply(tool_calls=(FakeToolCall("write_file", {"path": f"{marker}.txt", "content": marker}),))
    suffix = " (written)" if answered_tool else ""
    return Reply(f"Answer to {marker}{suffix}: the fake model has considered this message carefully.")


async def serve_llm() -> None:
    from fakes.llm import FakeLLM

    rng = random.Random()
    injected: dict[str, int] = defaultdict(int)

    class ChaosLLM(FakeLLM):
        async def _handle(self, request):  # noqa: ANN001, ANN202
            await asyncio.sleep(rng.uniform(0.05, 0.5))
            return await super()._handle(request)

    async with ChaosLLM(responder=lambda r: chaos_responder(r, rng, injected), chunk_chars=12, pings=False) as llm:
        print(json.dumps({"base_url": llm.base_url}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        print(json.dumps({"requests": len(llm.requests), **injected}), flush=True)


# ---- the database --------------------------------------------------------------------------------


async def fresh_database(base_url: str) -> tuple[str, str]:
    import asyncpg

    name = f"chaos_{uuid.uuid4().hex[:10]}"
    dsn = base_url.replace("postgresql+asyncpg://", "postgresql://")
    conn = await asyncpg.connect(dsn)
    await conn.execute(f'CREATE DATABASE "{name}"')
    await conn.close()
    url = base_url.rsplit("/", 1)[0] + "/" + name
    return url, name


async def drop_database(base_url: str, name: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(base_url.replace("postgresql+asyncpg://", "postgresql://"))
    await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await conn.close()


# ---- the three instances -----------------------------------------------------------------------


@dataclass
class Instance:
    name: str
    port: int
    config: Path
    env: dict[str, str]
    log: Path
    proc: asyncio.subprocess.Process | None = None
    starts: int = 0
    release: Path | None = None  # a released gateway's source tree it runs instead of this checkout

    def command(self, *args: str) -> tuple[list[str], dict[str, str], str | None]:
        """The gateway's command line, environment and directory: this checkout's, or the release's
        (its packages first on the path, the same installed dependencies)."""
        if self.release is None:
            return [GATEWAY, *args], self.env, None
        return [PYTHON, "-m", "gateway", *args], {**self.env, "PYTHONPATH": str(self.release)}, str(self.release)

    async def start(self) -> None:
        self.starts += 1
        log = open(self.log, "ab")  # noqa: SIM115 - the child keeps it
        argv, env, cwd = self.command("serve")
        self.proc = await asyncio.create_subprocess_exec(
            *argv,
            "--config",
            str(self.config),
            "--log-level",
            "warning",
            env=env,
            cwd=cwd,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )

    async def migrate(self) -> float:
        """`gateway migrate` with this instance's code and settings, as an operator runs it; its seconds."""
        argv, env, cwd = self.command("migrate", "--config", str(self.config))
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv, env=env, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {out.decode(errors='replace').strip()}")
        return time.monotonic() - started

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            os.kill(self.proc.pid, signal.SIGKILL)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.kill()
                await self.proc.wait()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


def instance_config(
    tmp: Path, name: str, port: int, llm_url: str, tg: FakeTelegram, slack: FakeSlack, users: dict[str, list]
) -> Path:
    """One instance's settings: what a deployment runs (pacing, pairing, the scheduler, a budget
    cap, attachments), with the drill's users as the admins who approve its tool calls."""
    busy_chat = users["telegram"][0]
    config = {
        "database": {"auto_migrate": False},
        "llm": {"base_url": llm_url, "model": "chaos-model", "max_retries": 6, "retry_budget_s": 60},
        "agent": {"workspace": str(tmp / "ws"), "max_rounds": 6, "tools": ["write_file", "read_file", "clock"]},
        "inbox": {"busy_mode": "queue", "lease_ttl_s": LEASE_TTL_S, "max_concurrent_turns": 16},
        "outbox": {"sweep_after_s": 20},
        "access": {"dm_policy": "pairing", "group_policy": "open", "pairing_ttl": "1h"},
        "approvals": {"admins": {"telegram": [ADMIN, *users["telegram"]], "slack": users["slack"]}},
        "budgets": {"caps": [{"scope": "job", "period": "day", "tokens": JOB_CAP_TOKENS}]},
        "serve": {"instance_id": name, "shutdown_grace": 5},
        "http": {"host": "127.0.0.1", "port": port},
        "scheduler": {
            "enabled": True,
            "poll_interval": "5s",
            "jobs": [
                {
                    "name": "chaos-report",
                    "cron": "* * * * *",
                    "prompt": "Write the scheduled report JOB.",
                    "deliver_to": f"telegram:{busy_chat}",
                }
            ],
        },
        "telegram": {  # Telegram's own limits are paced (the defaults): per chat and overall
            "api_base_url": tg.base_url,
            "api_file_url": f"{tg.url}/file/bot",
            "poll_timeout_s": 2,
            "edit_interval_s": 0.3,
            "request_timeout_s": 2,
        },
        "slack": {"api_base_url": slack.base_url, "send_interval_s": 0, "stream_interval_s": 0.3},
    }
    path = tmp / f"{name}.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def drill_users(threads: int) -> dict[str, list]:
    """The people of the drill's conversations (as `Drill.build` makes them), by channel."""
    telegram, slack = [], []
    for n in range(threads):
        if n % 2 == 0:
            telegram.append(1000 + n if n % 4 == 0 else 2000 + n)
        else:
            slack.append(f"U{n:03d}")
    return {"telegram": telegram, "slack": slack}


# ---- the conversations ---------------------------------------------------------------------------


@dataclass
class Sent:
    marker: str
    thread: str
    at: float
    tool: bool
    answered_at: float | None = None


@dataclass
class Conversation:
    key: str  # tg:<chat> or slack:<channel>:<root ts>
    kind: str  # tg_private | tg_group | slack
    chat: int | str
    user: int | str
    sent: list[Sent] = field(default_factory=list)
    root_ts: str = ""
    role: str = "admitted"  # admitted | paired (approved by an admin's tap during the run) | stranger

    @property
    def thread_key(self) -> str:
        if self.kind.startswith("tg"):
            return f"telegram:{self.chat}:"
        return f"slack:{self.chat}:{self.root_ts}"


class Drill:
    def __init__(self, args: argparse.Namespace, tg: FakeTelegram, slack: FakeSlack, instances: list[Instance]):
        self.args = args
        self.tg = tg
        self.slack = slack
        self.instances = instances
        self.rng = random.Random(args.seed)
        self.markers = iter(range(1, 100_000))
        self.conversations: list[Conversation] = []
        self.by_marker: dict[str, Sent] = {}
        self.senders = [SlackEventSender(f"http://127.0.0.1:{i.port}/slack/events", SIGNING_SECRET) for i in instances]
        self.tapped: set[str] = set()
        self.events: list[tuple[float, str, str]] = []  # (time, what, instance)
        self.done = asyncio.Event()
        self.quiet = asyncio.Event()  # the gateway has nothing left to do
        self.slack_posts = 0
        self.slack_refused = 0
        self.kills = self.leader_kills = 0
        self.takeovers: list[float] = []  # per thread held by a killed instance: seconds until picked up again
        self.not_taken_over = 0  # threads a killed instance held that nobody needed to pick up
        self.timers: list[asyncio.Task[None]] = []  # takeover and failover timings under way
        self.attachments = 0
        self.paired_at: dict[int, float] = {}  # person -> when the admin tapped Approve
        self.migration_s: float | None = None  # the rolling upgrade's `gateway migrate`
        self.upgrades: list[float] = []  # per instance replaced: seconds from its stop to ready again

    # -- users --
    def build(self) -> None:
        for n in range(self.args.threads):
            if n % 2 == 0 and n % 4 == 0:
                self.conversations.append(Conversation(f"tg:{1000 + n}", "tg_private", 1000 + n, 1000 + n))
            elif n % 2 == 0:
                self.conversations.append(Conversation(f"tg:{-5000 - n}", "tg_group", -5000 - n, 2000 + n))
            else:
                self.conversations.append(Conversation(f"slack:C{n:03d}", "slack", f"C{n:03d}", f"U{n:03d}"))
        for role, people in (("paired", PAIRED), ("stranger", STRANGERS)):
            for person in people:
                self.conversations.append(Conversation(f"tg:{person}", "tg_private", person, person, role=role))

    def new_text(self, conversation: Conversation) -> Sent:
        marker = f"M{next(self.markers):05d}"
        tool = self.rng.random() < self.args.tool_share
        sent = Sent(marker, conversation.key, time.monotonic(), tool)
        self.by_marker[marker] = sent
        conversation.sent.append(sent)
        return sent

    async def send(self, conversation: Conversation, sent: Sent) -> None:
        text = f"please answer {sent.marker}" + (" TOOL" if sent.tool else "")
        if conversation.kind.startswith("tg") and self.rng.random() < ATTACHMENT_SHARE:
            self.send_with_document(conversation, sent, text)
        elif conversation.kind == "tg_private":
            self.tg.private_message(int(conversation.chat), text)
        elif conversation.kind == "tg_group":
            self.tg.group_message(int(conversation.chat), f"@test_bot {text}", user_id=int(conversation.user))
        else:
            await self.slack_event(conversation, f"<@UBOT> {text}")

    def send_with_document(self, conversation: Conversation, sent: Sent, text: str) -> None:
        """A message with a small document attached, its text as the caption."""
        document = self.tg.files.document(f"notes for {sent.marker}\n".encode(), f"{sent.marker}.txt", "text/plain")
        chat, user = int(conversation.chat), int(conversation.user)
        if conversation.kind == "tg_private":
            update = self.tg.message_update(chat, text, user_id=user, media={"document": document})
        else:
            update = self.tg.message_update(
                chat, f"@test_bot {text}", user_id=user, chat_type="group", media={"document": document}
            )
        self.tg.enqueue(update)
        self.attachments += 1

    async def slack_event(self, conversation: Conversation, text: str) -> None:
        channel, user = str(conversation.chat), str(conversation.user)
        thread_ts = conversation.root_ts or None
        ts = self.slack.post_as_user(channel, user, text, thread_ts)["ts"]
        if not conversation.root_ts:
            conversation.root_ts = ts
        sender = self.senders[0]
        event = sender.mention(channel, user, text, ts=ts, thread_ts=thread_ts)
        body = json.dumps(sender.envelope(event, f"Ev{uuid.uuid4().hex[:12]}"))
        await self.post_to_any(body, "application/json")

    async def post_to_any(self, body: str, content_type: str) -> None:
        """Like Slack behind a load balancer: a random instance; a refused or failed delivery
        is retried (with X-Slack-Retry-Num) on another one until one answers 200."""
        for attempt in range(200):
            sender = self.rng.choice(self.senders)
            try:
                reply = await asyncio.wait_for(
                    sender.post(body, retry_num=attempt or None, content_type=content_type), 5
                )
                self.slack_posts += 1
                if reply.status == 200:
                    return
            except (OSError, TimeoutError, Exception):  # noqa: BLE001 - a dead instance
                self.slack_refused += 1
            await asyncio.sleep(0.2)
        raise RuntimeError("no instance took a Slack event for 200 tries")

    def planned_s(self) -> float:
        """How long the users keep talking: as long as the killer needs for its kills (its
        first after 8 s, then one every ~12 s), so that every kill lands on a busy gateway;
        a rolling upgrade needs at least 100 s (an instance replaced every fifth of it)."""
        kills = 10 + 12 * self.args.kills
        return max(kills, 100) if self.args.upgrade_from else kills

    async def user(self, conversation: Conversation, count: int, started: float) -> None:
        """Bursts of 1-3 messages, each burst after the answers to the previous one and not
        before its place in the plan (the bursts spread evenly over `planned_s`)."""
        bursts, left = [], count
        while left > 0:
            bursts.append(min(left, self.rng.choice((1, 1, 2, 3))))
            left -= bursts[-1]
        step = self.planned_s() / len(bursts)
        for n, burst in enumerate(bursts):
            due = started + n * step + self.rng.uniform(0, step / 2)
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            sent = [self.new_text(conversation) for _ in range(burst)]
            for message in sent:
                await self.send(conversation, message)
            if conversation.role == "stranger":
                continue  # never answered: nothing to wait for
            # This burst's answers (a lost earlier one would hold every later burst 180 s more).
            deadline = time.monotonic() + 180
            while time.monotonic() < deadline and any(s.answered_at is None for s in sent):
                await asyncio.sleep(0.2)

    # -- what the chats show --
    def chat_texts(self, conversation: Conversation) -> list[str]:
        return [text for _, text in self.chat_messages(conversation)]

    def chat_messages(self, conversation: Conversation) -> list[tuple[str, str]]:
        """(platform message id, text) of the bot's messages, after all edits."""
        if conversation.kind.startswith("tg"):
            return [(str(m.message_id), m.text) for m in self.tg.bot_messages(int(conversation.chat)) if m.text]
        if not conversation.root_ts:
            return []
        return [
            (str(m["ts"]), str(m.get("text") or ""))
            for m in self.slack.thread(str(conversation.chat), conversation.root_ts)
            if m.get("user") == self.slack.bot_user_id or m.get("bot_id")
        ]

    async def watch(self) -> None:
        """Marks answers as they appear and taps Approve on approval prompts."""
        import traceback

        while not self.done.is_set():
            now = time.monotonic()
            for conversation in self.conversations:
                try:
                    for text in self.chat_texts(conversation):
                        for marker in MARKER.findall(text):
                            sent = self.by_marker.get(marker)
                            if sent and sent.answered_at is None and text.startswith("Answer to"):
                                sent.answered_at = now
                    await self.tap_approvals(conversation)
                except Exception:  # noqa: BLE001 - keep watching; say what broke
                    traceback.print_exc()
            await asyncio.sleep(0.1)

    async def progress(self) -> None:
        started = time.monotonic()
        while not self.done.is_set():
            await asyncio.sleep(5)
            sent = len(self.by_marker)
            answered = sum(1 for s in self.by_marker.values() if s.answered_at is not None)
            alive = "".join("+" if i.alive else "-" for i in self.instances)
            print(
                f"  {time.monotonic() - started:6.0f}s  sent {sent:5d}  answered {answered:5d}  instances {alive}"
                f"  kills {sum(1 for _, w, _ in self.events if w.startswith('kill'))}",
                file=sys.stderr,
                flush=True,
            )
            strangers = {c.key for c in self.conversations if c.role == "stranger"}  # never answered
            late = [
                s
                for s in self.by_marker.values()
                if s.answered_at is None and time.monotonic() - s.at > 60 and s.thread not in strangers
            ]
            if late:
                print(f"    waiting over 60 s: {', '.join(f'{s.marker} ({s.thread})' for s in late[:8])}",
                      file=sys.stderr, flush=True)
            if self.args.verbose:
                for conversation in self.conversations[:3]:
                    print(f"    {conversation.key}: {self.chat_texts(conversation)[-3:]}", file=sys.stderr, flush=True)

    async def tap_approvals(self, conversation: Conversation) -> None:
        if conversation.kind.startswith("tg"):
            self.tap_telegram(conversation)
            return
        self.tap_slack(conversation)

    def tap_telegram(self, conversation: Conversation) -> None:
        chat = int(conversation.chat)
        for message in self.tg.bot_messages(chat):
            for row in message.buttons:
                for button in row:
                    key = f"tg:{chat}:{message.message_id}"
                    if "Approve" in button.get("text", "") and key not in self.tapped and self.may_approve(message):
                        self.tapped.add(key)
                        self.tg.press(chat, message.message_id, button["callback_data"], user_id=int(conversation.user))

    def may_approve(self, message: Any) -> bool:
        """Tool calls always; a pairing request only for the people to be paired, once they
        have waited a few seconds (their messages are held meanwhile), never for strangers."""
        found = PAIRING_REQUEST.search(message.text or "")
        if found is None:
            return True
        person = int(found.group(1))
        if person not in PAIRED or person in self.paired_at:
            return False
        first = next((c.sent[0].at for c in self.conversations if c.chat == person and c.sent), None)
        if first is None or time.monotonic() - first < 8:
            return False
        self.paired_at[person] = time.monotonic()
        return True

    def tap_slack(self, conversation: Conversation) -> None:
        if not conversation.root_ts:
            return
        for message in self.slack.thread(str(conversation.chat), conversation.root_ts):
            for block in message.get("blocks") or []:
                for element in block.get("elements") or []:
                    if element.get("type") != "button":
                        continue  # context blocks hold mrkdwn texts, not buttons
                    label = (element.get("text") or {}).get("text", "")
                    key = f"slack:{message.get('ts')}"
                    if "Approve" in label and key not in self.tapped:
                        self.tapped.add(key)
                        payload = self.senders[0].block_actions(
                            user=str(conversation.user),
                            channel=str(conversation.chat),
                            message_ts=message["ts"],
                            value=element["value"],
                            thread_ts=message.get("thread_ts"),
                            action_id=element["action_id"],
                        )
                        from urllib.parse import urlencode

                        body = urlencode({"payload": json.dumps(payload)})
                        asyncio.get_running_loop().create_task(
                            self.post_to_any(body, "application/x-www-form-urlencoded")
                        )

    # -- the rolling upgrade --
    async def upgrade_in_place(self) -> None:
        """The instances, started on the release, replaced one at a time as an operator does it:
        stopped (SIGTERM), the schema migrated by this checkout's `gateway migrate` before the
        first starts again, started on this checkout's code; the others serve meanwhile, the
        released ones on a schema newer than their code."""
        await asyncio.sleep(self.planned_s() / 5)
        for n, instance in enumerate(self.instances):
            at = time.monotonic()
            self.events.append((at, "upgrade-stop", instance.name))
            await instance.stop()
            instance.release = None
            if n == 0:
                self.migration_s = await instance.migrate()
            await instance.start()
            await wait_ready([instance])
            self.upgrades.append(time.monotonic() - at)
            self.events.append((time.monotonic(), "upgraded", instance.name))
            await asyncio.sleep(self.planned_s() / 5)

    # -- the killer --
    async def leader(self, store) -> str | None:  # noqa: ANN001
        holder = await store.inbox.lease_holder("leader")
        return holder.owner if holder else None

    async def leader_expiry(self, store) -> Any:  # noqa: ANN001
        holder = await store.inbox.lease_holder("leader")
        return holder.expires_at if holder else None

    async def killer(self, store) -> None:  # noqa: ANN001
        kills, leader_kills = 0, 0
        await asyncio.sleep(8)
        while kills < self.args.kills and not self.done.is_set():
            leader = await patient(lambda: self.leader(store))
            must_hit_leader = leader_kills < 3 and (self.args.kills - kills) <= (3 - leader_kills) * 2
            target = (
                next((i for i in self.instances if i.name == leader), None)
                if must_hit_leader or (leader and self.rng.random() < 0.35)
                else None
            )
            target = target or self.rng.choice(self.instances)
            if not target.alive:
                await asyncio.sleep(1)
                continue
            was_leader = target.name == leader
            held = await patient(lambda name=target.name: thread_leases(store, name), {})
            target.kill()
            at = time.monotonic()
            kills += 1
            leader_kills += was_leader
            self.kills, self.leader_kills = kills, leader_kills
            self.events.append((at, "kill-leader" if was_leader else "kill", target.name))
            await target.proc.wait()  # type: ignore[union-attr]
            leader_expiry = await patient(lambda: self.leader_expiry(store))  # once dead: it can extend it no more
            self.timers.append(asyncio.create_task(self.time_takeovers(store, held, at)))
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
            await target.start()
            self.events.append((time.monotonic(), "restart", target.name))
            if was_leader:
                self.timers.append(asyncio.create_task(self.time_failover(store, leader_expiry, at)))
            if kills < self.args.kills:
                await asyncio.sleep(self.rng.uniform(6, 14))

    async def time_takeovers(self, store, held: dict[str, Any], at: float) -> None:  # noqa: ANN001
        """Each thread lease the dead instance held: how long until some instance holds it
        anew (a dead process cannot extend it, so a later expiry is a new acquisition)."""
        waiting = dict(held)
        while waiting and time.monotonic() - at < 120 and not self.quiet.is_set():
            now = await patient(lambda: thread_leases(store, None, names=list(waiting)), {})
            for name, expires in list(waiting.items()):
                if name in now and now[name] > expires:
                    self.takeovers.append(time.monotonic() - at)
                    del waiting[name]
            await asyncio.sleep(0.1)
        self.not_taken_over += len(waiting)

    async def time_failover(self, store, expiry_at_kill: Any, at: float) -> None:  # noqa: ANN001
        """How long until some instance leads anew: the leader lease's expiry moves past what it
        was at the kill (the dead process cannot extend it). The restarted instance keeps its name
        and may be the one that leads again, so the owner's name says nothing."""
        for _ in range(1200):
            expiry = await patient(lambda: self.leader_expiry(store))
            if expiry is not None and (expiry_at_kill is None or expiry > expiry_at_kill):
                owner = await patient(lambda: self.leader(store))
                self.events.append((time.monotonic(), f"failover:{time.monotonic() - at:.2f}", owner or "?"))
                return
            await asyncio.sleep(0.05)


async def thread_leases(store, owner: str | None, *, names: list[str] | None = None) -> dict[str, Any]:  # noqa: ANN001
    """Unexpired thread leases (of `owner`, or by `names`): name -> expiry."""
    from sqlalchemy import select

    from gateway.events import utcnow
    from gateway.store.tables import leases

    query = select(leases.c.name, leases.c.expires_at).where(
        leases.c.name.like("thread:%"), leases.c.owner.is_not(None), leases.c.expires_at > utcnow()
    )
    if owner is not None:
        query = query.where(leases.c.owner == owner)
    if names is not None:
        query = query.where(leases.c.name.in_(names))
    return await store.db.read(lambda conn: {row.name: row.expires_at for row in conn.execute(query)})


# ---- the report ------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def answers_shown(
    drill: Drill, conversation: Conversation
) -> tuple[dict[str, list[tuple[str, str]]], list[str], int]:
    """From what the chat shows after all edits: the messages (thread key, platform id) that
    answer each marker, the markers in the order their first answer appears, and how many
    answers say they were cut off."""
    shown: dict[str, list[tuple[str, str]]] = defaultdict(list)
    order: list[str] = []
    cut = 0
    for message_id, text in drill.chat_messages(conversation):
        if not text.startswith("Answer to"):
            continue  # approval prompts and notices name markers too; they are not answers
        cut += "was cut off" in text
        for marker in dict.fromkeys(MARKER.findall(text)):
            shown[marker].append((conversation.thread_key, message_id))
            if marker not in order:
                order.append(marker)
    return shown, order, cut


def timed_out_sends(drill: Drill, uncertain_rows: list[Any]) -> tuple[int, list[str]]:
    """Every new message the fake Bot API carried out but answered too late, and those no
    outbox row of that chat (naming the same marker) records as uncertain."""
    recorded = [(row.thread_key, json.dumps(row.payload)) for row in uncertain_rows]
    injected = drill.tg.injected
    timeouts = [params for method, kind, _, params in injected if kind == "timeout" and method == "sendMessage"]
    unrecorded = []
    for params in timeouts:
        chat, text = str(params.get("chat_id")), str(params.get("text") or "")
        markers = MARKER.findall(text)
        if not any(
            thread.split(":")[1] == chat and all(m in payload for m in markers) for thread, payload in recorded
        ):
            unrecorded.append(f"{chat}: {text[:60]}")
    return len(timeouts), unrecorded


async def report(drill: Drill, store, started: float, llm_faults: dict[str, int], started_at) -> dict[str, Any]:  # noqa: ANN001
    from sqlalchemy import func, select

    from gateway.events import utcnow
    from gateway.store.tables import prompts

    lost, out_of_order, cut, strangers_answered = [], [], 0, []
    answers: dict[str, list[tuple[str, str]]] = {}
    for conversation in drill.conversations:
        shown, order, cut_here = answers_shown(drill, conversation)
        if conversation.role == "stranger":
            strangers_answered += answered_markers(drill.chat_texts(conversation))
            continue
        cut += cut_here
        mine = [s.marker for s in conversation.sent]
        lost += [m for m in mine if not shown.get(m)]
        answers.update({m: shown[m] for m in mine if m in shown})
        if order != [m for m in mine if m in order]:
            out_of_order.append(conversation.key)
    twice = duplicates(answers, await outbox_by_message(store))

    async def count(*where) -> int:  # noqa: ANN002
        query = select(func.count()).select_from(prompts).where(prompts.c.kind == "approval", *where)
        return await store.db.read(lambda conn: conn.execute(query).scalar_one())

    approvals, approved = await count(), await count(prompts.c.status == "approved")
    uncertain_rows = await store.outbox.uncertain(limit=10_000)
    undelivered = await store.outbox.undelivered(limit=10_000)
    timeouts, unrecorded = timed_out_sends(drill, uncertain_rows)
    injected = drill.tg.injected
    latencies = [s.answered_at - s.at for s in drill.by_marker.values() if s.answered_at is not None]
    failovers = [float(what.split(":")[1]) for _, what, _ in drill.events if what.startswith("failover:")]
    takeovers = sorted(drill.takeovers)
    in_flight = [v for v in drill.tg.flood_violations if v[3] < HOLD_KNOWN_S]
    broken = [v for v in drill.tg.flood_violations if v[3] >= HOLD_KNOWN_S]
    return {
        "messages": len(drill.by_marker),
        "threads": len(drill.conversations),
        "messages needing an approval": sum(1 for s in drill.by_marker.values() if s.tool),
        "lost": len(lost),
        "answered twice": len(twice["listed"]),
        "answered twice, not explained by a recorded ambiguous send": len(twice["unexplained"]),
        "answered twice (each: its messages and outbox keys)": twice["listed"][:20],
        "strangers' messages answered": len(strangers_answered),
        "people paired during the run": len(drill.paired_at),
        "messages with a document": drill.attachments,
        "sends already under way when another instance was told to wait (refused, resent after)": len(in_flight),
        "sends into a chat Telegram held (flood wait broken)": len(broken),
        "flood waits broken (first)": [
            f"{m} to {c}, {left:.1f}s early, {since * 1000:.0f} ms after the 429" for m, c, left, since in broken[:10]
        ],
        "job firings": await job_firings(store, started_at, utcnow()),
        "job spend": await job_spend(store, JOB_CAP_TOKENS),
        "faults": [f"{what} {name}" for _, what, name in drill.events if what.split(":")[0] in ("stop", "db-down")],
        "order kept": f"{100 * (1 - len(out_of_order) / max(1, len(drill.conversations))):.1f}%",
        "approvals resolved": f"{approved}/{approvals}",
        "answers cut off (LLM stream cut, notice shown)": cut,
        "telegram faults injected": {
            "429": sum(1 for _, kind, _, _ in injected if kind == "429"),
            "timeout after delivering": sum(1 for _, kind, _, _ in injected if kind == "timeout"),
            "timeout on a new message (sendMessage)": timeouts,
        },
        "llm faults injected": llm_faults,
        "timed-out new messages not recorded uncertain": len(unrecorded),
        "outbox rows recorded uncertain": len(uncertain_rows),
        "outbox rows undelivered at the end": len(undelivered),
        "latency message to reply p50 s": round(pct(latencies, 50), 2),
        "latency message to reply p95 s": round(pct(latencies, 95), 2),
        "kills": drill.kills,
        "leader kills": drill.leader_kills,
        "leader failover s (each)": [round(f, 2) for f in failovers],
        "inbox.lease_ttl_s": LEASE_TTL_S,
        "thread picked up again after its instance died s (n, p50, max)": (
            len(takeovers), round(pct(takeovers, 50), 2), round(max(takeovers, default=float("nan")), 2)
        ),
        "threads a killed instance held that nobody had to pick up": drill.not_taken_over,
        "thread wait from kill to answer s (p50, max)": thread_waits(drill),
        "slack deliveries refused by a dead instance (retried elsewhere)": drill.slack_refused,
        "rolling upgrade": {
            "from": drill.args.upgrade_from,
            "instances replaced": len(drill.upgrades),
            "gateway migrate s (the others serving)": round(drill.migration_s or 0, 2),
            "each instance from its stop to ready on the new code s": [round(u, 2) for u in drill.upgrades],
        } if drill.args.upgrade_from else None,
        "wall s": round(time.monotonic() - started, 1),
        "lost markers": lost[:20],
        "unrecorded timeouts": unrecorded[:10],
        "threads out of order": out_of_order[:10],
    }


def verdict(figures: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """What does not hold: the drill's promises, and that it really did the kills and faults."""
    approvals = int(figures["approvals resolved"].split("/")[1])
    failed = {
        **delivery_promises(figures),
        "no approvals exercised": approvals == 0 and args.tool_share > 0,
        "fewer kills than asked": figures["kills"] < args.kills,
        "leader killed fewer than 3 times": figures["leader kills"] < min(3, args.kills),
        "a leader kill without a failover measured": len(figures["leader failover s (each)"]) < figures["leader kills"],
        "no Telegram faults injected": sum(figures["telegram faults injected"].values()) == 0,
        "nobody paired during the run": figures["people paired during the run"] < len(PAIRED),
        "a flood wait broken": figures["sends into a chat Telegram held (flood wait broken)"] != 0,
        "a job firing missing or recorded twice": bool(
            figures["job firings"]["missing"] or figures["job firings"]["recorded twice"]
        ),
        "a job over its budget cap": figures["job spend"]["over the cap"],
        "fewer SIGSTOPs than asked": sum(1 for f in figures["faults"] if f.startswith("stop")) < args.stops,
        "fewer database restarts than asked": (
            sum(1 for f in figures["faults"] if f.startswith("db-down")) < args.db_restarts
        ),
        "no LLM faults injected": not any(n for k, n in figures["llm faults injected"].items() if k != "requests"),
        "an instance left on the release": bool(
            args.upgrade_from and figures["rolling upgrade"]["instances replaced"] < 3
        ),
    }
    return [what for what, bad in failed.items() if bad]


def thread_waits(drill: Drill) -> tuple[float, float] | None:
    """For each kill: messages sent before it and answered after it, whose answer took longer
    than a normal answer: the time from the kill to their answer."""
    kills = [at for at, what, _ in drill.events if what.startswith("kill")]
    waits = []
    for at in kills:
        for sent in drill.by_marker.values():
            if sent.at < at and sent.answered_at is not None and sent.answered_at > at + 1.0:
                waits.append(sent.answered_at - at)
    if not waits:
        return None
    return round(statistics.median(waits), 2), round(max(waits), 2)


# ---- main --------------------------------------------------------------------------------------------


async def start_llm() -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__).resolve()),
        "--serve-llm",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    line = await proc.stdout.readline()  # type: ignore[union-attr]
    return proc, json.loads(line)["base_url"]


async def llm_faults(proc: asyncio.subprocess.Process) -> dict[str, int]:
    """Ends the fake LLM and reads the faults it injected."""
    proc.stdin.close()  # type: ignore[union-attr]
    line = await proc.stdout.readline()  # type: ignore[union-attr]
    return json.loads(line) if line else {}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def run(args: argparse.Namespace) -> int:
    base = os.environ.get(POSTGRES_ENV, "")
    if not base:
        print(f"{POSTGRES_ENV} is not set: the drill needs PostgreSQL (three instances share it)")
        return 2
    from gateway.events import utcnow
    from gateway.store import Store, upgrade

    url, dbname = await fresh_database(base)
    store = Store(url)
    tmp = Path(tempfile.mkdtemp(prefix="chaos-"))
    release = release_tree(args.upgrade_from, tmp / "release") if args.upgrade_from else None
    if release is None:
        await upgrade(store.db)
    llm_proc, llm_url = await start_llm()
    (tmp / "ws").mkdir()
    instances: list[Instance] = []
    keep_db = False
    try:
        async with FakeTelegram() as tg, FakeSlack() as slack:
            tg.timeout_delay_s = 3.0
            tg.random_faults(
                ("sendMessage", "editMessageText", "sendMessageDraft"),
                rate_429=0.02,
                retry_after=(1, 40),
                rate_timeout=0.01,
                seed=args.seed,
            )
            env = {
                **os.environ,
                "GATEWAY_DATABASE_URL": url,
                "TELEGRAM_BOT_TOKEN": tg.token,
                "SLACK_BOT_TOKEN": slack.token,
                "SLACK_SIGNING_SECRET": SIGNING_SECRET,
            }
            env.pop("SLACK_APP_TOKEN", None)
            tg.keep_flood_waits()
            users = drill_users(args.threads)
            for n in range(3):
                name = f"gw{n + 1}"
                port = free_port()
                config = instance_config(tmp, name, port, llm_url, tg, slack, users)
                instances.append(Instance(name, port, config, env, tmp / f"{name}.log", release=release))
            await start_all(instances)
            drill = Drill(args, tg, slack, instances)
            drill.build()
            for sender in drill.senders:
                await sender.__aenter__()
            started, started_at = time.monotonic(), utcnow()
            per_thread = args.messages // args.threads
            watcher = asyncio.create_task(drill.watch())
            progress = asyncio.create_task(drill.progress())
            killer = asyncio.create_task(drill.killer(store))
            faults = [
                staller(drill.instances, args.stops, lambda: LEASE_TTL_S + drill.rng.uniform(1, 4), drill.events,
                        drill.rng, drill.done),
                database_restarter(args.db_restarts, 10.0, drill.events, drill.rng, drill.done),
            ]
            if release is not None:
                faults.append(drill.upgrade_in_place())
            faulting = [asyncio.create_task(f) for f in faults]
            talks = [drill.user(c, per_thread if c.role == "admitted" else 3, started) for c in drill.conversations]
            await asyncio.gather(*talks)
            await killer  # its kills count in the verdict; a crash of it fails the drill here
            await asyncio.gather(*faulting)  # likewise the stops and database restarts
            await quiescent(store, [c.thread_key for c in drill.conversations if c.role == "stranger"])
            drill.quiet.set()
            await asyncio.sleep(3)  # late duplicates would show up now
            drill.done.set()
            await asyncio.gather(watcher, progress, *drill.timers)
            figures = await report(drill, store, started, await llm_faults(llm_proc), started_at)
            for sender in drill.senders:
                await sender.__aexit__(None, None, None)
            for instance in instances:
                await instance.stop()
            print(f"python bench/chaos.py {' '.join(sys.argv[1:])}")
            print(json.dumps(figures, indent=2))
            print(f"logs: {tmp}")
            broken = verdict(figures, args)
            keep_db = bool(broken) and args.keep_db_on_failure
            kept = f"\ndatabase kept for a look: {dbname} (drop it by hand afterwards)" if keep_db else ""
            print("all promises held" if not broken else f"DOES NOT HOLD: {', '.join(broken)}{kept}")
            return 0 if not broken else 1
    finally:
        for instance in instances:
            instance.kill()
        if llm_proc.stdin is not None and not llm_proc.stdin.is_closing():
            llm_proc.stdin.close()
        await llm_proc.wait()
        await store.close()
        await (asyncio.sleep(0) if keep_db else drop_database(base, dbname))


async def quiescent(store, strangers: list[str], limit_s: float = 120) -> None:  # noqa: ANN001
    """Waits until the gateway has nothing left to do (no inbox item waiting, no outbox row
    undelivered; strangers' messages stay held), so that a late resend would be seen; only a
    signal to stop waiting: the figures are counted from the chats."""
    from sqlalchemy import func, select

    from gateway.store.tables import inbox

    query = (
        select(func.count())
        .select_from(inbox)
        .where(inbox.c.status.in_(("pending", "held")), inbox.c.thread_key.not_in(strangers))
    )
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        waiting = await patient(lambda: store.db.read(lambda conn: conn.execute(query).scalar_one()), 1)
        if not waiting and not await patient(lambda: store.outbox.undelivered(limit=1), [None]):
            return
        await asyncio.sleep(0.5)
    print(f"the gateway still had work after {limit_s:.0f} s", file=sys.stderr, flush=True)


async def start_all(instances: list[Instance]) -> None:
    """The three instances, ready; on a release, its own `gateway migrate` makes the database first."""
    if instances[0].release is not None:
        await instances[0].migrate()
    for instance in instances:
        await instance.start()
    await wait_ready(instances)


def release_tree(rev: str, into: Path) -> Path:
    """The released gateway's packages at `rev` of this repository, unpacked into `into`."""
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "gateway", "channels", "scheduler"],
        capture_output=True, check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


async def wait_ready(instances: list[Instance]) -> None:
    import httpx

    async with httpx.AsyncClient() as http:
        for instance in instances:
            for _ in range(300):
                try:
                    if (await http.get(f"http://127.0.0.1:{instance.port}/readyz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
            else:
                raise RuntimeError(f"{instance.name} did not become ready; see {instance.log}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--stops", type=int, default=5, help="SIGSTOPs of an instance past the lease TTL")
    parser.add_argument("--db-restarts", type=int, default=2, help="PostgreSQL stopped for 10 s, then started")
    parser.add_argument("--tool-share", type=float, default=0.08, help="messages that need an approval")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--keep-db-on-failure", action="store_true", help="keep the drill's database when a promise breaks"
    )
    parser.add_argument("--verbose", action="store_true", help="show the last messages of a few chats as it runs")
    parser.add_argument(
        "--upgrade-from", metavar="REV", default="",
        help="a rolling upgrade: the instances start on this released commit (its schema) and are replaced one "
        "by one by this checkout's code, the schema migrated while the others serve",
    )
    parser.add_argument("--serve-llm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upgrade_from and (args.kills or args.stops):
        parser.error("--upgrade-from replaces the instances itself: give it with --kills 0 --stops 0")
    if args.serve_llm:
        asyncio.run(serve_llm())
        return 0
    signal.signal(signal.SIGTERM, _interrupted)  # a plain kill still stops the instances it started
    return asyncio.run(run(args))


def _interrupted(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    sys.exit(main())
