"""Sub-agents and `kill -9`: a gateway process running children is killed with SIGKILL, then a
gateway on the same database takes over (Telegram and Slack, SQLite and PostgreSQL).

- a single child cut short continues in a new run, and the parent's turn completes;
- a parallel batch cut short is failed and reported to the parent's model, not silently re-run;
- a child that had finished before the crash is not asked again: its result comes from the
  database; the rest of the batch continues, and so does the parent.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from fakes.llm import Reply, Stall, user_texts
from fakes.slack import SIGNING_SECRET, SlackEventSender
from helpers import tool_results
from subagent_chat import ANN_SLACK, Agents, chat_config, delegate, open_chat, platform
from test_chat_cli import child_env
from test_slack_e2e import DM
from test_telegram_e2e import PRIVATE, until

from gateway.agent.tool_calls import RESTART_NOT_RERUN
from gateway.store.tables import delegations

TARGET = Path(__file__).resolve().parent / "crash_target.py"


@pytest.fixture(params=["telegram", "slack"])
def kind(request) -> str:
    return request.param


@pytest.fixture
async def fake(kind):
    async with platform(kind) as server:
        yield server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _ready(process: asyncio.subprocess.Process) -> None:
    """Until the target says it is ready; the start log's lines (its stderr) may come first."""
    said = b""
    while (line := await process.stdout.readline()).strip() != b"ready":
        assert line, b"the target ended before it was ready:\n" + said
        said += line


@asynccontextmanager
async def doomed_gateway(kind: str, store, config, tmp_path) -> AsyncIterator[Any]:  # noqa: ANN001
    """The gateway as a process of its own (killed by the test), and a way to talk to it."""
    port = free_port()
    settings = config.model_dump(mode="json")
    settings["http"]["port"] = port
    path = tmp_path / "crash.json"
    path.write_text(
        json.dumps({"config": settings, "url": store.db.url, "pg_schema": store.db.pg_schema, "http": kind == "slack"})
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(TARGET),
        str(path),
        env=child_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await asyncio.wait_for(_ready(process), 60)
        yield process, port
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


async def say_to_process(kind: str, fake, port: int, text: str) -> None:  # noqa: ANN001
    if kind == "telegram":
        fake.private_message(PRIVATE, text)
        return
    ts = fake.post_as_user(DM, ANN_SLACK, text)["ts"]
    async with SlackEventSender(
        f"http://127.0.0.1:{port}/slack/events", SIGNING_SECRET, team_id=fake.team_id
    ) as sender:
        reply = await sender.event(sender.dm(DM, ANN_SLACK, text, ts=ts))
    assert reply.status == 200, reply.text


async def kill_9(process) -> None:  # noqa: ANN001
    process.send_signal(signal.SIGKILL)
    assert await asyncio.wait_for(process.wait(), 30) == -signal.SIGKILL


async def task_rows(store) -> list:  # noqa: ANN001
    rows = await store.db.read(lambda conn: conn.execute(delegations.select().order_by(delegations.c.id)).all())
    return [await store.delegations.get(r.id) for r in rows]


async def wait_for_requests(llm, agents: Agents, key: str, count: int) -> None:  # noqa: ANN001
    await until(lambda: agents.asked.count(key) >= count, 30)


async def test_kill_9_while_a_child_runs_continues_the_child_then_the_parent(store, llm, kind, fake, tmp_path) -> None:
    agents = Agents()
    llm.responder = agents
    agents.script(
        "find out", Reply(tool_calls=(delegate({"prompt": "Look it up.", "name": "lookup"}),)), Reply("It is 42.")
    )
    agents.script("Look it up", Stall("thinking"), Reply("The answer is 42."))
    config = chat_config(kind, llm, fake, tmp_path)
    async with doomed_gateway(kind, store, config, tmp_path) as (process, port):
        await say_to_process(kind, fake, port, "find out the answer")
        await asyncio.wait_for(llm.stalled.wait(), 30)  # the child is mid-call
        await kill_9(process)
    (task,) = await task_rows(store)
    assert task.status == "running" and (await store.runs.get(task.child_run_id)).stage == "RUNNING"
    async with open_chat(kind, store, config, fake) as chat:
        await chat.settle(lambda: "It is 42." in chat.texts(), timeout=30)
        assert chat.texts().count("It is 42.") == 1
        assert sum(t.startswith("🤖 agent → lookup") for t in chat.texts()) == 1  # started once, shown once
    (task,) = await task_rows(store)
    assert (task.status, task.result) == ("done", "The answer is 42.")
    child_runs = await store.runs.list(session_id=task.child_session_id)
    assert sorted((r.stage, r.error) for r in child_runs) == [("FAILED", "restart"), ("SUCCESS", None)]
    assert tool_results(llm.requests[-1]) == ["The answer is 42."]
    assert agents.asked.count("Look it up") == 2  # the interrupted call, then once more after the restart


async def test_kill_9_during_a_parallel_batch_fails_it_and_tells_the_parent(store, llm, kind, fake, tmp_path) -> None:
    agents = Agents()
    llm.responder = agents
    batch = (
        delegate({"prompt": "Part one.", "name": "one"}, id="d1"),
        delegate({"prompt": "Part two.", "name": "two"}, id="d2"),
    )
    agents.script("do both", Reply(tool_calls=batch), Reply("Both parts were interrupted; shall I retry?"))
    agents.script("Part one", Stall("working"))
    agents.script("Part two", Stall("working"))
    config = chat_config(kind, llm, fake, tmp_path)
    async with doomed_gateway(kind, store, config, tmp_path) as (process, port):
        await say_to_process(kind, fake, port, "do both parts")
        await wait_for_requests(llm, agents, "Part one", 1)
        await wait_for_requests(llm, agents, "Part two", 1)
        await kill_9(process)
    async with open_chat(kind, store, config, fake) as chat:
        await chat.settle(lambda: "Both parts were interrupted; shall I retry?" in chat.texts(), timeout=30)
    results = tool_results(llm.requests[-1])
    assert len(results) == 2 and all(RESTART_NOT_RERUN in r for r in results)
    assert [t.status for t in await task_rows(store)] == ["failed", "failed"]
    assert agents.asked.count("Part one") == agents.asked.count("Part two") == 1  # not run again


async def test_kill_9_after_a_child_finished_takes_its_result_from_the_database(
    store, llm, kind, fake, tmp_path
) -> None:
    agents = Agents()
    llm.responder = agents
    batch = (
        delegate({"prompt": "Quick part.", "name": "quick"}, id="d1"),
        delegate({"prompt": "Slow part.", "name": "slow"}, id="d2"),
    )
    agents.script("do the parts", Reply(tool_calls=batch), Reply("Quick and slow are both done."))
    agents.script("Quick part", Reply("quick result"))
    agents.script("Slow part", Stall("working"), Reply("slow result"))
    config = chat_config(kind, llm, fake, tmp_path)
    async with doomed_gateway(kind, store, config, tmp_path) as (process, port):
        await say_to_process(kind, fake, port, "do the parts")
        await asyncio.wait_for(llm.stalled.wait(), 30)

        async def quick_done() -> bool:
            return any(t.name == "quick" and t.status == "done" for t in await task_rows(store))

        for _ in range(1500):
            if await quick_done():
                break
            await asyncio.sleep(0.02)
        assert await quick_done()
        await kill_9(process)
    tasks = await task_rows(store)
    parent_call = await store.sessions.get_tool_call(tasks[0].parent_tool_call_id)
    assert parent_call.status == "running"  # the parent never saw the quick child's result
    async with open_chat(kind, store, config, fake) as chat:
        await chat.settle(lambda: "Quick and slow are both done." in chat.texts(), timeout=30)
    assert tool_results(llm.requests[-1]) == ["quick result", "slow result"]
    assert agents.asked.count("Quick part") == 1  # delivered from the database, the model was not asked again
    assert agents.asked.count("Slow part") == 2
    assert user_texts(llm.requests[-1])[0] == "do the parts"
