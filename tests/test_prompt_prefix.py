"""Prompts a provider can cache (docs/context.md, "Caching"): across the rounds and turns of a
session, each request to the model starts with the one before it, byte for byte, up to that
one's tail (the clock, the scratchpad, what changes every round), except right after a
reshaping the run records as PREFIX_CHANGED (a fold, or old tool results stubbed). The system
message and the tools array never change within a session: not with a note taken mid-turn,
not with a fold, not when another person of another role speaks in a group.

Driven through the whole gateway (inbox, turn loop, tools, a fold's summariser) against the
fake model server, which keeps every request body as it arrived."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fakes.llm import FakeLLM, FakeToolCall, Reply
from harness import make_config, running_gateway

from gateway.context.compaction import SUMMARY_SYSTEM
from gateway.events import InboundMessage, Sender, ThreadKey
from gateway.memory.scope import chat_owner, person_owner

ADA, BOB, MEL = Sender("11", "Ada", "ada"), Sender("12", "Bob", "bob"), Sender("13", "Mel", "mel")
PLAN = "plan:"
TAIL_START = "[context] "


def _text(message: dict[str, Any]) -> str:
    return str(message.get("content") or "")


def planner(request: dict[str, Any]) -> Reply:
    """A summary for the summariser; else one tool round per step of the plan in the newest
    message holding one, then an answer."""
    messages = request["messages"]
    if _text(messages[0]) == SUMMARY_SYSTEM:
        return Reply("Summary: files were read, notes taken. " * 8)
    start = max(i for i, m in enumerate(messages) if m["role"] == "user" and PLAN in _text(m))
    steps = [s.strip() for s in _text(messages[start]).rsplit(PLAN, 1)[1].split("\n")[0].split("|") if s.strip()]
    done = sum(1 for m in messages[start + 1 :] if m.get("tool_calls"))
    if done == len(steps):
        return Reply("Done: here is what I found. " * 4)
    verb, _, arg = steps[done].partition(" ")
    call_id = f"c{len(messages)}_{done}"
    if verb == "read":
        return Reply(tool_calls=(FakeToolCall("read_file", {"path": arg}, call_id),))
    if verb == "list":
        return Reply(tool_calls=(FakeToolCall("list_dir", {"path": arg}, call_id),))
    key, _, value = arg.partition("=")
    return Reply(tool_calls=(FakeToolCall("scratchpad_set", {"key": key, "value": value}, call_id),))


def plans(shared: Path, turns: int) -> list[str]:
    steps = [
        f"read {shared}/report.txt",
        f"list {shared} | note step=listed",
        f"read {shared}/log.txt | note step=read the log",
        "note owner=whoever asked",
    ]
    return [f"Question {n}: look into item {n}.\n{PLAN} {steps[n % len(steps)]}" for n in range(turns)]


def stable_part(last: dict[str, Any]) -> str | None:
    """A request's last message without the tail: None when it is the tail alone."""
    text = _text(last)
    if last["role"] != "user" or TAIL_START not in text:
        return text
    if text.startswith(TAIL_START):
        return None
    return text.split(f"\n\n{TAIL_START}", 1)[0]


def continues(earlier: dict[str, Any], later: dict[str, Any]) -> bool:
    """Whether `later` starts with `earlier` up to its tail: the same tools, the same messages,
    and the message the tail was joined to continued, not changed."""
    if earlier.get("tools") != later.get("tools"):
        return False
    head, last = earlier["messages"][:-1], earlier["messages"][-1]
    if later["messages"][: len(head)] != head:
        return False
    stable = stable_part(last)
    if stable is None:
        return True
    following = later["messages"][len(head)] if len(later["messages"]) > len(head) else None
    return following is not None and following["role"] == last["role"] and _text(following).startswith(stable)


async def changed_before_each_request(store, thread: ThreadKey) -> list[bool]:  # noqa: ANN001
    """For each model request of the thread's turns (in order): whether a PREFIX_CHANGED was
    recorded since the request before it."""
    flags, changed = [], False
    for run in sorted(await store.runs.list(thread_key=str(thread)), key=lambda r: r.id):
        for event in await store.runs.events(run.id):
            if event.kind == "PREFIX_CHANGED":
                changed = True
            elif event.kind == "LLM_REQUEST":
                flags.append(changed)
                changed = False
    return flags


def shared_files(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "log.txt").write_text("".join(f"04:00:{i % 60:02d} worker-{i % 7} batch {i} ok\n" for i in range(150)))
    (shared / "report.txt").write_text("".join(f"Section {i}: figures rose by {i}%.\n" for i in range(150)))
    return shared


def config(llm: FakeLLM, tmp_path: Path, shared: Path):  # noqa: ANN201
    return make_config(
        llm.base_url, str(tmp_path / "ws"),
        llm={"context_window": 12_000, "reserve_pct": 10},
        context={"headroom_tokens": 4_000},
        agent={"shared_dir": str(shared)},
        memory={"scope": "person"},
        access={"users": {f"fake:{MEL.id}": "guest"}, "roles": {"guest": {"deny_tools": ["list_dir"]}}},
    )


async def remember(store, people: tuple[Sender, ...], group: ThreadKey | None) -> None:  # noqa: ANN001
    for person in people:
        owner = person_owner("fake", person.id)
        await store.memory.save(owner, f"{person.name} likes short answers.", created_by=f"fake:{person.id}",
                                source="user", author_name=person.name)
        await store.memory.set_shared(owner, True)
    if group is not None:
        await store.memory.save(chat_owner(group), "The team ships on Fridays.", created_by=f"fake:{ADA.id}",
                                source="user", author_name="Ada")


async def converse(store, tmp_path: Path, thread: ThreadKey, speakers: tuple[Sender, ...], *, private: bool):  # noqa: ANN001, ANN201
    shared = shared_files(tmp_path)
    await remember(store, speakers, None if private else thread)
    async with FakeLLM(responder=planner) as llm:
        async with running_gateway(store, config(llm, tmp_path, shared)) as h:
            for n, text in enumerate(plans(shared, 16)):
                sender = speakers[n % len(speakers)]
                event = InboundMessage(thread, sender, text, f"fake:{thread.chat}:{n}", message_id=str(n),
                                       private=private)
                await h.gateway.submit([event])
                await h.idle()
        turns = [r for r in llm.requests if r.get("tools")]  # the summariser's calls offer no tools
        folds = len(llm.requests) - len(turns)
    return turns, folds, await changed_before_each_request(store, thread)


def check_invariant(turns: list[dict[str, Any]], folds: int, changed: list[bool]) -> None:
    assert folds >= 2, "the conversation is long enough to be folded more than once"
    assert len(changed) == len(turns)
    assert len({str(r["messages"][0]) for r in turns}) == 1  # one system message for the whole session
    assert len({str(r["tools"]) for r in turns}) == 1  # one tools array, whoever asks
    broken = [n for n in range(1, len(turns)) if not continues(turns[n - 1], turns[n])]
    assert broken, "a fold changed the prefix somewhere"
    unexplained = [n for n in broken if not changed[n]]
    assert unexplained == [], f"requests {unexplained} changed the prefix without a reshaping"
    assert sum(changed) <= folds + 3  # the prefix changes rarely: at folds (and stubbing on its own)


async def test_a_private_chats_requests_each_start_with_the_one_before(store, tmp_path) -> None:
    thread = ThreadKey("fake", ADA.id, "")
    turns, folds, changed = await converse(store, tmp_path, thread, (ADA,), private=True)
    check_invariant(turns, folds, changed)
    assert any("- step: " in _text(r["messages"][-1]) for r in turns)  # the scratchpad, in the tail


async def test_a_group_of_three_keeps_its_prefix_whoever_speaks(store, tmp_path) -> None:
    thread = ThreadKey("fake", "group1", "")
    turns, folds, changed = await converse(store, tmp_path, thread, (ADA, BOB, MEL), private=False)
    check_invariant(turns, folds, changed)
    system = _text(turns[0]["messages"][0])
    assert "The team ships on Fridays." in system and "likes short answers" not in system  # the group's own
    mels = [r for r in turns if "Mel likes short answers." in _text(r["messages"][-1])]
    assert mels and all("Ada likes" not in _text(r["messages"][-1]) for r in mels)  # each speaker's own, in the tail
    assert all("list_dir" in _text(r["messages"][-1]) for r in mels)  # her role's refusal is said there too
