"""How much of what the gateway sends a provider could be read from its prompt cache (issue 41).

    .venv/bin/python bench/prompt_cache.py                    # private chat and a group of three
    .venv/bin/python bench/prompt_cache.py --window 16384 --turns 30 --gap 60 --verbose

A 30-turn conversation with tools, driven through the real gateway: python-telegram-bot against
the fake Bot API, the fake model server (tests/fakes/llm.py) answering by a plan written in each
message (read a file, list a directory, take a note in the scratchpad, ask the clock, then
answer), with a window small enough that the history is folded and stubbed along the way. Once
in a private chat, once in a group of three people of different roles, each with memory saved
before the session (the group's speakers share theirs with groups).

Every request is kept as the provider receives it (the raw body; the tools put first, where a
provider's template renders them) and billed as the providers bill prompt caching: a request
reads from the cache the longest byte prefix it shares with an earlier request still alive
(written or read in the last 5 minutes of the conversation's clock: turns `--gap` seconds
apart), when that prefix is at least 1,024 tokens; the rest is written to the cache at 1.25x;
reads cost 0.1x. Tokens are characters / 4. The summariser's requests (a fold) are billed too
but are not part of the share.

Prints per chat: the share of input tokens read from the cache from turn 3 on, the folds and
the requests, and the input cost of the 30 turns with caching and without.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from aiohttp import web  # noqa: E402
from fakes.llm import FakeLLM, FakeToolCall, Reply  # noqa: E402
from fakes.telegram import FakeTelegram  # noqa: E402

from gateway.app import Gateway  # noqa: E402
from gateway.config import Config  # noqa: E402
from gateway.context.compaction import SUMMARY_SYSTEM  # noqa: E402
from gateway.events import ThreadKey  # noqa: E402
from gateway.llm import LLMClient  # noqa: E402
from gateway.memory.scope import chat_owner, person_owner  # noqa: E402
from gateway.store import Store  # noqa: E402

CHARS_PER_TOKEN = 4
MIN_CACHED_TOKENS = 1024
WRITE_RATE, READ_RATE = 1.25, 0.1
LIFETIME_S = 300.0
PRICE_PER_MTOK = 3.0  # USD per million input tokens (a mid-size hosted model); the ratios are what matter
FROM_TURN = 3
ROUND_S = 3.0  # a tool round's distance on the conversation's clock

PRIVATE = 4242
GROUP = -100777
ADA, BOB, MEL = 11, 12, 13  # an admin, a member, a guest whose role denies list_dir
NAMES = {ADA: "Ada", BOB: "Bob", MEL: "Mel"}
PLAN = "plan:"


# ---- the model ----------------------------------------------------------------------------------
def _text(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):
        return " ".join(str(p.get("text") or "") for p in content)
    return str(content)


def answer(request: dict[str, Any]) -> Reply:
    """The fake model: a summary for the summariser, else the next step of the plan in the
    newest message that holds one (one step per tool round), then a text answer."""
    messages = request.get("messages") or []
    if messages and messages[0].get("role") == "system" and _text(messages[0]) == SUMMARY_SYSTEM:
        return Reply("Summary: " + "the people asked for files, notes and listings; decisions kept. " * 24)
    start = max((i for i, m in enumerate(messages) if m.get("role") == "user" and PLAN in _text(m)), default=-1)
    if start < 0:
        return Reply("I am here.")
    said = _text(messages[start])
    steps = [s.strip() for s in said.rsplit(PLAN, 1)[1].split("\n")[0].split("|") if s.strip()]
    done = sum(1 for m in messages[start + 1 :] if m.get("role") == "assistant" and m.get("tool_calls"))
    n = len(messages)
    if done < len(steps):
        return Reply(tool_calls=(step_call(steps[done], f"c{n}_{done}"),))
    return Reply(("Done. Here is what I found, in a few sentences the person can use. " * 6).strip())


def step_call(step: str, call_id: str) -> FakeToolCall:
    verb, _, arg = step.partition(" ")
    if verb == "read":
        return FakeToolCall("read_file", {"path": arg}, call_id)
    if verb == "list":
        return FakeToolCall("list_dir", {"path": arg or "."}, call_id)
    if verb == "note":
        key, _, value = arg.partition("=")
        return FakeToolCall("scratchpad_set", {"key": key, "value": value}, call_id)
    return FakeToolCall("clock", {}, call_id)


class RecordingLLM(FakeLLM):
    """The fake model server, keeping each request's body as it arrived (its bytes)."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.bodies: list[bytes] = []

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.read())
        return await super()._handle(request)


# ---- the conversation ---------------------------------------------------------------------------
def script(turns: int, shared: Path) -> list[str]:
    """Each turn's message: most use tools, some several rounds."""
    plans = [
        f"read {shared}/report.txt",
        "clock",
        f"list {shared}",
        f"read {shared}/log.txt | note progress=read the log",
        "",
        f"read {shared}/report.txt | clock",
        f"note owner=whoever asked last | list {shared}",
        f"read {shared}/log.txt",
    ]
    said = []
    for n in range(turns):
        plan = plans[n % len(plans)]
        words = f"Question {n}: please look into item {n} and tell me what you see."
        said.append(f"{words}\n{PLAN} {plan}" if plan else words)
    return said


@dataclass
class Sent:
    turn: int
    at: float  # on the conversation's clock
    body: bytes
    summary: bool


@dataclass
class Bill:
    tokens: int = 0
    read: int = 0
    written: int = 0
    requests: int = 0

    def cost(self) -> float:
        fresh = self.tokens - self.read - self.written
        return (fresh + self.written * WRITE_RATE + self.read * READ_RATE) * PRICE_PER_MTOK / 1e6

    def uncached(self) -> float:
        return self.tokens * PRICE_PER_MTOK / 1e6

    @property
    def share(self) -> float:
        return self.read / self.tokens if self.tokens else 0.0


@dataclass
class Figures:
    label: str
    sent: list[Sent] = field(default_factory=list)
    folds: int = 0
    fold_turns: list[int] = field(default_factory=list)
    verbose: bool = False


def provider_view(body: bytes) -> bytes:
    """The request as a provider's prompt holds it: the tools first (a template renders them
    before the conversation), then the rest in the order sent; the body's own bytes when its
    `tools` already come first."""
    data = json.loads(body)
    if "tools" not in data or next(iter(data)) == "tools":
        return body
    ordered = {"tools": data.pop("tools"), **data}
    return json.dumps(ordered, ensure_ascii=False, separators=(",", ":")).encode()


def common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    lo, hi = 0, n  # binary search on equal slices (C speed) instead of a byte loop
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def bill(figures: Figures) -> tuple[Bill, Bill, Bill]:
    """(conversation from turn 3, every conversation request, summariser requests)."""
    alive: list[tuple[bytes, float]] = []  # cached prompts and when they were last written or read
    from_turn, total, summaries = Bill(), Bill(), Bill()
    for sent in figures.sent:
        view = provider_view(sent.body)
        tokens = len(view) // CHARS_PER_TOKEN
        alive = [(b, t) for b, t in alive if sent.at - t <= LIFETIME_S]
        best, best_index = 0, -1
        for index, (earlier, _) in enumerate(alive):
            shared = common_prefix(view, earlier)
            if shared > best:
                best, best_index = shared, index
        read = best // CHARS_PER_TOKEN if best // CHARS_PER_TOKEN >= MIN_CACHED_TOKENS else 0
        if read and best_index >= 0:
            alive[best_index] = (alive[best_index][0], sent.at)  # a read keeps it alive
        written = tokens - read if tokens >= MIN_CACHED_TOKENS else 0
        alive.append((view, sent.at))
        if figures.verbose:
            print(f"    turn {sent.turn:2} at {sent.at:6.0f}s: {tokens:6,} tokens, read {read:6,}"
                  f"{' (summary)' if sent.summary else ''}")
        for account in (summaries,) if sent.summary else (total, *((from_turn,) if sent.turn >= FROM_TURN else ())):
            account.tokens += tokens
            account.read += read
            account.written += written
            account.requests += 1
    return from_turn, total, summaries


def config(fake: FakeTelegram, llm: FakeLLM, tmp: Path, window: int) -> Config:
    data: dict[str, Any] = {
        "llm": {"base_url": llm.base_url, "model": "bench-model", "context_window": window},
        "agent": {"workspace": str(tmp / "ws"), "shared_dir": str(tmp / "shared"),
                  "system_prompt": "You are the team's assistant. " * 40},
        "memory": {"scope": "person"},
        "scheduler": {"enabled": False},
        "serve": {"shutdown_grace": 2},
        "inbox": {"poll_interval_s": 0.05},
        "approvals": {"self_approve": True, "admins": {"telegram": [ADA, PRIVATE]}},
        "access": {
            "dm_policy": "open", "group_policy": "open",
            "users": {f"telegram:{MEL}": "guest"}, "roles": {"guest": {"deny_tools": ["list_dir"]}},
        },
        "telegram": {"token": fake.token, "api_base_url": fake.base_url, "poll_timeout_s": 1, "edit_interval_s": 0,
                     "typing_after_s": 0, "rate_overall_per_s": 0, "rate_private_per_s": 0,
                     "rate_group_per_min": 0},
    }
    return Config.model_validate(data)


def files(shared: Path) -> None:
    shared.mkdir(parents=True, exist_ok=True)
    line = "2026-12-07 04:00:{:02d} worker-{} processed batch {} in {} ms, 0 errors, queue depth {}\n"
    (shared / "log.txt").write_text("".join(line.format(i % 60, i % 7, i, 40 + i % 13, i % 5) for i in range(120)))
    (shared / "report.txt").write_text("".join(f"Section {i}: the quarterly figures rose by {i}% in region {i % 9}. "
                                               "Costs stayed flat; the team hired two people.\n" for i in range(60)))


async def remember(store: Store, group: bool) -> None:
    """Memory saved before the session: the person's, the group's, and the speakers' shared."""
    people = (ADA, BOB, MEL) if group else (PRIVATE,)
    for person in people:
        owner = person_owner("telegram", str(person))
        for k in range(3):
            await store.memory.save(owner, f"{NAMES.get(person, 'Ann')} prefers short answers, fact {k}.",
                                    created_by=f"telegram:{person}", source="user",
                                    author_name=NAMES.get(person, "Ann"))
        if group and person != MEL:
            await store.memory.set_shared(owner, True)
    if group:
        owner = chat_owner(ThreadKey("telegram", str(GROUP)))
        for k in range(4):
            await store.memory.save(owner, f"The team ships on Fridays, rule {k}.", created_by=f"telegram:{ADA}",
                                    source="user", author_name="Ada")


async def converse(turns: int, window: int, gap: float, group: bool, verbose: bool) -> Figures:
    figures = Figures("group of three" if group else "private chat", verbose=verbose)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        files(tmp / "shared")
        async with FakeTelegram() as fake, RecordingLLM(responder=answer, pings=False) as llm:
            store = Store(f"sqlite+aiosqlite:///{tmp}/bench.db")
            await store.migrate()
            await remember(store, group)
            cfg = config(fake, llm, tmp, window)
            gateway = Gateway(cfg, store=store, llm=LLMClient(cfg.llm, backoff_base_s=0.01), serve_http=False)
            await gateway.start()
            try:
                speakers = (ADA, BOB, MEL)
                for turn, text in enumerate(script(turns, tmp / "shared")):
                    first = len(llm.bodies)
                    chat = GROUP if group else PRIVATE
                    replies = len(fake.bot_messages(chat))
                    if group:
                        who = speakers[turn % 3]
                        fake.group_message(GROUP, f"@test_bot {text}", user_id=who, first_name=NAMES[who])
                    else:
                        fake.private_message(PRIVATE, text)
                    deadline = time.monotonic() + 30
                    while len(fake.bot_messages(chat)) <= replies and time.monotonic() < deadline:
                        await asyncio.sleep(0.01)
                    await gateway.inbox.wait_until_idle(10)
                    rounds = 0
                    for body in llm.bodies[first:]:
                        summary = SUMMARY_SYSTEM.encode() in body[:4000] and b'"tools"' not in body
                        figures.sent.append(Sent(turn, turn * gap + rounds * ROUND_S, body, summary))
                        if summary:
                            figures.folds += 1
                            figures.fold_turns.append(turn)
                        rounds += 1
                    if verbose:
                        print(f"  turn {turn:2}: {len(llm.bodies) - first} requests, "
                              f"{sum(len(b) for b in llm.bodies[first:])} bytes", flush=True)
            finally:
                await gateway.stop()
                await store.close()
    return figures


def report(figures: Figures) -> None:
    from_turn, total, summaries = bill(figures)
    saved = 1 - (total.cost() + summaries.cost()) / ((total.uncached() + summaries.uncached()) or 1)
    print(f"{figures.label}: {total.requests} requests, {figures.folds} folds (turns {figures.fold_turns})")
    print(f"  cache share from turn {FROM_TURN}: {from_turn.share:6.1%} of {from_turn.tokens:,} input tokens "
          f"(written {from_turn.written:,}); all turns {total.share:.1%}")
    print(f"  input cost of the turns: ${total.cost() + summaries.cost():.4f} with caching, "
          f"${total.uncached() + summaries.uncached():.4f} without ({saved:.1%} saved; summaries "
          f"${summaries.cost():.4f}, {summaries.requests} requests)")


async def main(args: argparse.Namespace) -> None:
    print(f"{args.turns} turns, a {args.window:,}-token window, turns {args.gap:.0f} s apart; "
          f"cache: >= {MIN_CACHED_TOKENS} tokens, write {WRITE_RATE}x, read {READ_RATE}x, {LIFETIME_S:.0f} s; "
          f"${PRICE_PER_MTOK}/M input tokens")
    for group in (False, True) if args.only is None else (args.only == "group",):
        report(await converse(args.turns, args.window, args.gap, group, args.verbose))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--window", type=int, default=32_768, help="the model's window in tokens")
    parser.add_argument("--gap", type=float, default=60.0, help="seconds between turns on the conversation's clock")
    parser.add_argument("--only", choices=["private", "group"])
    parser.add_argument("--verbose", action="store_true", help="each turn's requests and what each read from the cache")
    asyncio.run(main(parser.parse_args()))
