"""How much of what the gateway sends a provider could be read from its prompt cache (issue 41).

    .venv/bin/python bench/prompt_cache.py                    # private chat and a group of three
    .venv/bin/python bench/prompt_cache.py --api anthropic --only group --verbose

A 30-turn conversation with tools, driven through the real gateway: python-telegram-bot against
the fake Bot API, the fake model server of each API (Chat Completions: tests/fakes/llm.py,
Responses: tests/fakes/llm_responses.py, Anthropic Messages: tests/fakes/anthropic.py) answering
by a plan written in each message (read a file, list a directory, take a note in the scratchpad, ask the clock, then
answer), with a window small enough that the history is folded and stubbed along the way. Once
in a private chat, once in a group of three people of different roles, each with memory saved
before the session (the group's speakers share theirs with groups).

Every request is kept as the provider receives it (the raw body) and billed as its provider
bills prompt caching. A cache entry lives 5 minutes of the conversation's clock (turns `--gap`
seconds apart) from when it was last written or read; reads cost 0.1x, writes 1.25x; a prefix
shorter than 1,024 tokens is not cached; tokens are characters / 4.
- Chat Completions and Responses (automatic prefix caching, as OpenAI): the tools put first
  (where a template renders them), a request reads the longest byte prefix it shares with an
  earlier request still alive, rounded down to a step of 128 tokens beyond 1,024; the rest is
  written.
- Anthropic Messages: only at `cache_control` breakpoints. A request reads the longest prefix
  ending at one of its breakpoints that an earlier request wrote (the API looks back 20 blocks
  from each breakpoint; here a breakpoint's prefix hits when the same prefix up to a breakpoint
  was written before), and writes from there to its last breakpoint; what follows the last
  breakpoint is neither.
The summariser's requests (a fold) are billed too but are not part of the share.

Prints per API and chat: the share of input tokens read from the cache from turn 3 on, the
folds and the requests, and the input cost of the 30 turns with caching and without; then a
table of them all.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from aiohttp import web  # noqa: E402
from fakes.anthropic import FakeAnthropic, _breakpoint_prefixes  # noqa: E402
from fakes.llm import FakeLLM, FakeToolCall, Reply  # noqa: E402
from fakes.llm_responses import FakeResponses  # noqa: E402
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
STEP_TOKENS = 128  # OpenAI caches a prefix in steps of 128 tokens beyond the first 1,024
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
def _text(content: Any) -> str:
    if isinstance(content, list):
        return " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return str(content or "")


@dataclass(frozen=True)
class Said:
    """One entry of a request's conversation, whatever the API: who, the words, a tool call?"""

    role: str
    text: str = ""
    call: bool = False


def system_of(request: dict[str, Any]) -> str:
    if "instructions" in request or "input" in request:  # Responses
        return str(request.get("instructions") or "")
    if "system" in request:  # Anthropic
        return _text(request["system"])
    messages = request.get("messages") or []
    return _text(messages[0].get("content")) if messages and messages[0].get("role") == "system" else ""


def conversation(request: dict[str, Any]) -> Iterator[Said]:
    """The request's conversation as entries, from Chat Completions messages, Responses input
    items or Anthropic content blocks."""
    for item in request.get("input") or []:
        kind = item.get("type")
        if kind == "function_call":
            yield Said("assistant", call=True)
        elif kind == "message":
            yield Said(item.get("role", ""), _text(item.get("content")))
    for message in request.get("messages") or []:
        role, content = message.get("role", ""), message.get("content")
        if not isinstance(content, list) or role == "system":
            yield Said(role, _text(content), bool(message.get("tool_calls")))
            continue
        for block in content:
            kind = block.get("type")
            if kind in ("tool_use", "tool_result"):
                yield Said("assistant" if kind == "tool_use" else "tool", call=kind == "tool_use")
            elif kind == "text":
                yield Said(role, str(block.get("text") or ""))


CALL_IDS = itertools.count()  # tool call ids unique in the run (a fold may shorten the history)


def answer(request: dict[str, Any]) -> Reply:
    """The fake model: a summary for the summariser, else the next step of the plan in the
    newest message that holds one (one step per tool round), then a text answer."""
    if system_of(request) == SUMMARY_SYSTEM:
        return Reply("Summary: " + "the people asked for files, notes and listings; decisions kept. " * 24)
    said = list(conversation(request))
    start = max((i for i, s in enumerate(said) if s.role == "user" and PLAN in s.text), default=-1)
    if start < 0:
        return Reply("I am here.")
    plan = said[start].text.rsplit(PLAN, 1)[1].split("\n")[0]
    steps = [s.strip() for s in plan.split("|") if s.strip()]
    done = sum(1 for s in said[start + 1 :] if s.call)
    if done < len(steps):
        return Reply(tool_calls=(step_call(steps[done], f"call_{next(CALL_IDS)}"),))
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


class Recording(FakeLLM):
    """A fake model server keeping each request's body as it arrived (its bytes); mixed into
    the fake of each API."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.bodies: list[bytes] = []

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.bodies.append(await request.read())
        return await super()._handle(request)


class RecordingChat(Recording):
    pass


class RecordingResponses(Recording, FakeResponses):
    pass


class RecordingAnthropic(Recording, FakeAnthropic):
    pass


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
    api: str
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


def cacheable(tokens: int, step: int = 1) -> int:
    """The tokens of a prefix a provider caches: none under 1,024, else down to a step beyond."""
    return 0 if tokens < MIN_CACHED_TOKENS else tokens - (tokens - MIN_CACHED_TOKENS) % step


@dataclass
class Charge:
    tokens: int
    read: int
    written: int
    where: str = ""  # where the cached prefix ends (for --verbose)


class PrefixCache:
    """Automatic prefix caching (OpenAI's Chat Completions and Responses): the longest prefix
    shared with a prompt still alive, in steps of 128 tokens."""

    def __init__(self) -> None:
        self.alive: list[tuple[bytes, float]] = []  # prompts and when they were last written or read

    def charge(self, body: bytes, at: float) -> Charge:
        view = provider_view(body)
        tokens = len(view) // CHARS_PER_TOKEN
        self.alive = [(b, t) for b, t in self.alive if at - t <= LIFETIME_S]
        best, best_index = 0, -1
        for index, (earlier, _) in enumerate(self.alive):
            shared = common_prefix(view, earlier)
            if shared > best:
                best, best_index = shared, index
        read = cacheable(best // CHARS_PER_TOKEN, STEP_TOKENS)
        if read:
            self.alive[best_index] = (self.alive[best_index][0], at)  # a read keeps it alive
        self.alive.append((view, at))
        where = f"breaks at byte {best:,}: ...{view[max(0, best - 60) : best + 60]!r}" if best < len(view) else ""
        return Charge(tokens, read, cacheable(tokens, STEP_TOKENS) - read if tokens >= MIN_CACHED_TOKENS else 0, where)


class BreakpointCache:
    """Anthropic's caching at `cache_control` breakpoints: the longest breakpoint prefix an
    earlier request wrote (still alive) is read, the rest up to the last breakpoint written."""

    def __init__(self) -> None:
        self.alive: dict[str, float] = {}  # a breakpoint's prefix -> when last written or read

    def charge(self, body: bytes, at: float) -> Charge:
        request = json.loads(body)
        prefixes = _breakpoint_prefixes(request)
        tokens = len(whole_text(request)) // CHARS_PER_TOKEN
        self.alive = {p: t for p, t in self.alive.items() if at - t <= LIFETIME_S}
        hits = [p for p in prefixes if p in self.alive and len(p) // CHARS_PER_TOKEN >= MIN_CACHED_TOKENS]
        read = max((len(p) // CHARS_PER_TOKEN for p in hits), default=0)
        for p in hits:
            self.alive[p] = at
        last = cacheable(len(prefixes[-1]) // CHARS_PER_TOKEN) if prefixes else 0
        written = max(0, last - read)
        self.alive.update((p, at) for p in prefixes if len(p) // CHARS_PER_TOKEN >= MIN_CACHED_TOKENS)
        marks = ", ".join(f"{len(p) // CHARS_PER_TOKEN:,}{' hit' if p in hits else ''}" for p in prefixes)
        return Charge(tokens, read, written, f"breakpoints at tokens [{marks}] of {tokens:,}")


def whole_text(request: dict[str, Any]) -> str:
    """The request's text as the breakpoint prefixes measure it, to its very end."""
    messages = [dict(m) for m in request.get("messages") or []]
    if messages and isinstance(messages[-1].get("content"), list) and messages[-1]["content"]:
        blocks = list(messages[-1]["content"])
        blocks[-1] = {**blocks[-1], "cache_control": {"type": "ephemeral"}}
        messages[-1]["content"] = blocks
    prefixes = _breakpoint_prefixes({**request, "messages": messages})
    return prefixes[-1] if prefixes else ""


CACHES: dict[str, type[PrefixCache | BreakpointCache]] = {
    "chat": PrefixCache, "responses": PrefixCache, "anthropic": BreakpointCache,
}
FAKES: dict[str, type[Recording]] = {"chat": RecordingChat, "responses": RecordingResponses,
                                     "anthropic": RecordingAnthropic}


def bill(figures: Figures) -> tuple[Bill, Bill, Bill]:
    """(conversation from turn 3, every conversation request, summariser requests)."""
    cache = CACHES[figures.api]()
    from_turn, total, summaries = Bill(), Bill(), Bill()
    for sent in figures.sent:
        charge = cache.charge(sent.body, sent.at)
        if figures.verbose:
            print(f"    turn {sent.turn:2} at {sent.at:6.0f}s: {charge.tokens:6,} tokens, read {charge.read:6,}"
                  f"{' (summary)' if sent.summary else ''}  {charge.where}")
        for account in (summaries,) if sent.summary else (total, *((from_turn,) if sent.turn >= FROM_TURN else ())):
            account.tokens += charge.tokens
            account.read += charge.read
            account.written += charge.written
            account.requests += 1
    return from_turn, total, summaries


def config(fake: FakeTelegram, llm: FakeLLM, tmp: Path, window: int) -> Config:
    data: dict[str, Any] = {
        "llm": {"base_url": llm.base_url, "model": "bench-model", "context_window": window, **llm.settings},
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


async def converse(api: str, turns: int, window: int, gap: float, group: bool, verbose: bool) -> Figures:
    figures = Figures(api, "group of three" if group else "private chat", verbose=verbose)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        files(tmp / "shared")
        async with FakeTelegram() as fake, FAKES[api](responder=answer, pings=False) as llm:
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
                        summary = system_of(json.loads(body)) == SUMMARY_SYSTEM
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


@dataclass
class Result:
    figures: Figures
    from_turn: Bill
    total: Bill
    summaries: Bill

    def cost(self) -> float:
        return self.total.cost() + self.summaries.cost()

    def uncached(self) -> float:
        return self.total.uncached() + self.summaries.uncached()


def report(figures: Figures) -> Result:
    result = Result(figures, *bill(figures))
    from_turn, total, summaries = result.from_turn, result.total, result.summaries
    saved = 1 - result.cost() / (result.uncached() or 1)
    print(f"{figures.api}, {figures.label}: {total.requests} requests, {figures.folds} folds "
          f"(turns {figures.fold_turns})")
    print(f"  cache share from turn {FROM_TURN}: {from_turn.share:6.1%} of {from_turn.tokens:,} input tokens "
          f"(written {from_turn.written:,}); all turns {total.share:.1%}")
    print(f"  input cost of the turns: ${result.cost():.4f} with caching, ${result.uncached():.4f} without "
          f"({saved:.1%} saved; summaries ${summaries.cost():.4f}, {summaries.requests} requests)", flush=True)
    return result


def table(results: list[Result]) -> None:
    print(f"\n| API | chat | share from turn {FROM_TURN} | folds | cost cached | cost uncached |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r.figures.api} | {r.figures.label} | {r.from_turn.share:.1%} | {r.figures.folds} "
              f"| ${r.cost():.3f} | ${r.uncached():.3f} |")


async def main(args: argparse.Namespace) -> None:
    print(f"{args.turns} turns, a {args.window:,}-token window, turns {args.gap:.0f} s apart; "
          f"cache: >= {MIN_CACHED_TOKENS} tokens, write {WRITE_RATE}x, read {READ_RATE}x, {LIFETIME_S:.0f} s; "
          f"${PRICE_PER_MTOK}/M input tokens")
    apis = list(CACHES) if args.api == "all" else [args.api]
    chats = (False, True) if args.only is None else (args.only == "group",)
    results = [report(await converse(api, args.turns, args.window, args.gap, group, args.verbose))
               for api in apis for group in chats]
    table(results)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--window", type=int, default=32_768, help="the model's window in tokens")
    parser.add_argument("--gap", type=float, default=60.0, help="seconds between turns on the conversation's clock")
    parser.add_argument("--api", choices=[*CACHES, "all"], default="all", help="the API the gateway speaks")
    parser.add_argument("--only", choices=["private", "group"])
    parser.add_argument("--verbose", action="store_true", help="each turn's requests and what each read from the cache")
    asyncio.run(main(parser.parse_args()))
