"""Sub-agents end to end, through the Telegram and the Slack fakes, on SQLite and PostgreSQL:
`delegate` runs children as sessions of their own, synchronously (alone or as a parallel
batch) or in the background, with their approvals in the parent's chat.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
from fakes.llm import FakeToolCall, Reply, Stall, user_texts
from helpers import session_file, tool_results, until
from subagent_chat import Agents, chat_config, delegate, open_chat, platform, tool_names

from gateway.approvals.policy import AUTO_DENIED
from gateway.cli.reports import print_children
from gateway.store.tables import delegations, prompts

SHELL_ALLOWED = {"rules": [{"tool": "shell", "action": "allow"}]}


@pytest.fixture(params=["telegram", "slack"])
def kind(request) -> str:
    return request.param


@pytest.fixture
async def fake(kind):
    async with platform(kind) as server:
        yield server


async def tasks_in_order(store) -> list:  # noqa: ANN001
    rows = await store.db.read(lambda conn: conn.execute(delegations.select().order_by(delegations.c.id)).all())
    return [await store.delegations.get(r.id) for r in rows]


# --- synchronous -------------------------------------------------------------------------


async def test_a_synchronous_child_answers_the_parents_call(store, llm, kind, fake, tmp_path, capsys) -> None:
    agents = Agents()
    llm.responder = agents
    agents.script(
        "what is the capital",
        Reply(tool_calls=(delegate({"prompt": "Find the capital of France.", "name": "research"}),)),
        Reply("The capital is Paris."),
    )
    agents.script("Find the capital", Reply("Paris, since 508."))
    async with open_chat(kind, store, chat_config(kind, llm, fake, tmp_path), fake) as chat:
        await chat.say("what is the capital of France?")
        await chat.settle(lambda: "The capital is Paris." in chat.texts())
        start, done, reply = chat.texts()
        assert (
            start.startswith("🤖 agent → research\n") and "Find the capital of France." in start
        )  # the prompt, quoted
        assert (done, reply) == ("✅ research finished → agent: Paris, since 508.", "The capital is Paris.")
    parent_first, child, parent_second = llm.requests
    assert "delegate" in tool_names(parent_first)
    assert user_texts(child) == ["Find the capital of France."]  # its own history: the task alone
    assert "delegate" not in tool_names(child) and "shell" in tool_names(child)  # the parent's tools minus delegate
    assert tool_results(parent_second) == ["Paris, since 508."]
    (task,) = await tasks_in_order(store)
    assert (task.name, task.status, task.depth, task.background, task.result) == (
        "research",
        "done",
        1,
        False,
        "Paris, since 508.",
    )
    child_session = await store.sessions.get(task.child_session_id)
    assert child_session.kind == "child" and [m.content for m in await store.sessions.history(child_session.id)] == [
        "Find the capital of France.",
        "Paris, since 508.",
    ]
    parent_run = await store.runs.get(task.parent_run_id)
    child_run = await store.runs.get(task.child_run_id)
    assert (parent_run.stage, child_run.stage) == ("SUCCESS", "SUCCESS")
    # The child's use counts towards the parent's run (and so its session).
    assert child_run.input_tokens > 0 and parent_run.llm_calls == 3
    assert any(e.kind == "CHILD_RUN" for e in await store.runs.events(parent_run.id))
    tree = await store.delegations.tree(parent_run.id)
    assert [(level, t.id) for level, t in tree] == [(1, task.id)]
    print_children([(level, t, await store.runs.get(t.child_run_id)) for level, t in tree])  # `gateway runs show`
    shown = capsys.readouterr().out
    assert "sub-agents:" in shown and f"└ #{task.id} research (sync, done)  run {child_run.id} SUCCESS" in shown


async def test_a_parallel_batch_finishing_out_of_order_is_recorded_in_call_order(
    store, llm, kind, fake, tmp_path
) -> None:
    agents = Agents()
    llm.responder = agents
    batch = (
        delegate({"prompt": "Task A: count slowly.", "name": "a"}, id="da"),
        delegate({"prompt": "Task B: count.", "name": "b"}, id="db"),
        delegate({"prompt": "Task C: answer at once.", "name": "c"}, id="dc"),
    )
    agents.script("run three", Reply(tool_calls=batch), Reply("All three are back."))
    for key, sleep in (("Task A", 1.2), ("Task B", 0.6), ("Task C", 0)):
        agents.script(
            key,
            Reply(tool_calls=(FakeToolCall("shell", {"command": f"sleep {sleep}; echo {key} done"}, "s"),)),
            Reply(f"{key} answer"),
        )
    config = chat_config(kind, llm, fake, tmp_path, approvals=SHELL_ALLOWED)
    async with open_chat(kind, store, config, fake) as chat:
        await chat.say("run three tasks")
        await chat.settle(lambda: "All three are back." in chat.texts(), timeout=30)
        finished = [t for t in chat.texts() if "finished" in t]
        assert [t.split()[1] for t in finished] == ["c", "b", "a"]  # shown as they finish
    tasks = await tasks_in_order(store)
    assert [t.name for t in tasks] == ["a", "b", "c"]  # rows allocated in call order
    assert tasks[2].finished_at < tasks[1].finished_at < tasks[0].finished_at  # finished out of order
    assert all(t.status == "done" for t in tasks)
    # ...recorded in call order: the tool rows settled a, b, c and the model reads them so.
    assert tool_results(llm.requests[-1]) == ["Task A answer", "Task B answer", "Task C answer"]
    history = await store.sessions.history(tasks[0].parent_session_id)
    calls = [c for m in history for c in m.tool_calls]
    assert [c.call_id for c in calls] == ["da", "db", "dc"]
    settled = await store.db.read(
        lambda conn: (
            conn.exec_driver_sql("SELECT call_id FROM tool_calls WHERE name = 'delegate' ORDER BY finished_at, id")
            .scalars()
            .all()
        )
    )
    assert settled == ["da", "db", "dc"]


# --- approvals -----------------------------------------------------------------------------


async def test_a_childs_shell_call_is_approved_in_the_parent_chat_by_button(store, llm, kind, fake, tmp_path) -> None:
    agents = Agents()
    llm.responder = agents
    agents.script(
        "clean up",
        Reply(tool_calls=(delegate({"prompt": "Remove the temp files.", "name": "janitor"}),)),
        Reply("The janitor is done."),
    )
    agents.script(
        "Remove the temp",
        Reply(tool_calls=(FakeToolCall("shell", {"command": "echo removed > gone.txt"}, "s1"),)),
        child_answer := Reply("Removed them."),
    )
    async with open_chat(kind, store, chat_config(kind, llm, fake, tmp_path), fake) as chat:
        await chat.say("clean up please")
        await chat.settle(lambda: bool(chat.prompts()))
        (prompt,) = chat.prompts()
        assert "🤖 janitor → wants to run shell" in chat.prompt_text(prompt).replace("`", "")
        written = tmp_path / "ws" / "sessions" / "1" / "gone.txt"  # the child works in its parent's directory
        assert not written.exists()
        task = (await tasks_in_order(store))[0]
        assert (await store.runs.get(task.child_run_id)).stage == "AWAITING_INPUT"
        assert (await store.runs.get(task.parent_run_id)).stage == "AWAITING_INPUT"  # the parent waits, parked too
        await chat.say("/status")
        await chat.settle(lambda: any(t.startswith("Status:") for t in chat.texts()))
        status = next(t for t in chat.texts() if t.startswith("Status:"))
        assert f"sub-agent #{task.id} janitor: running" in status and "Pending requests: 1" in status
        await chat.press(prompt, "Approve")
        await chat.settle(lambda: "The janitor is done." in chat.texts())
    assert written.read_text().strip() == "removed"
    assert child_answer.text in tool_results(llm.requests[-1])[0]
    task = (await tasks_in_order(store))[0]
    assert task.status == "done"
    assert ((await store.runs.get(task.child_run_id)).stage, (await store.runs.get(task.parent_run_id)).stage) == (
        "SUCCESS",
        "SUCCESS",
    )
    decided = await store.db.read(lambda conn: conn.execute(prompts.select()).all())
    assert [(p.session_id, p.run_id, p.status, p.decided_by) for p in decided] == [
        (task.child_session_id, task.child_run_id, "approved", "42" if kind == "telegram" else "U1")
    ]


async def test_in_a_scheduled_run_a_childs_shell_call_is_auto_denied(store, llm, kind, fake, tmp_path) -> None:
    agents = Agents()
    llm.responder = agents
    target = "telegram:42" if kind == "telegram" else "slack:D1"
    job = {"name": "nightly", "cron": "0 3 * * *", "prompt": "Nightly: clean up.", "deliver_to": target}
    agents.script(
        "Nightly",
        Reply(tool_calls=(delegate({"prompt": "Remove the temp files.", "name": "janitor"}),)),
        Reply("Nightly report: the janitor could not run shell."),
    )
    agents.script(
        "Remove the temp",
        Reply(tool_calls=(FakeToolCall("shell", {"command": "echo removed > gone.txt"}, "s1"),)),
        Reply("I was not allowed to run shell."),
    )
    config = chat_config(kind, llm, fake, tmp_path, scheduler={"enabled": True, "jobs": [job]})
    async with open_chat(kind, store, config, fake) as chat:
        schedule = await store.schedules.by_name("nightly")
        await chat.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
        await chat.settle(lambda: any("Nightly report" in t for t in chat.texts()) or bool(chat.prompts()))
        assert not session_file(tmp_path / "ws", "gone.txt").exists()
        assert not any("wants to run" in chat.prompt_text(p) for p in chat.prompts())  # nobody was asked
        assert not any(t.startswith("🤖") for t in chat.texts())  # nobody watches a scheduled run's children
    child_second = next(r for r in llm.requests if user_texts(r)[0].startswith("Remove") and tool_results(r))
    assert tool_results(child_second) == [AUTO_DENIED]
    (task,) = await tasks_in_order(store)
    assert task.status == "done" and (await store.sessions.get(task.child_session_id)).interactive is False


# --- background ----------------------------------------------------------------------------


async def test_a_background_task_reports_back_and_starts_a_parent_turn(store, llm, kind, fake, tmp_path) -> None:
    agents = Agents()
    agents.script(
        "look into",
        Reply(tool_calls=(delegate({"prompt": "Survey the logs.", "name": "survey"}, background=True),)),
        Reply("I started a survey; I will tell you."),
        Reply("Survey result: 3 errors."),
    )
    agents.script("Survey the logs", Reply("The logs show 3 errors."))

    async def child_answers_after_the_parents_turn(request: dict[str, Any]) -> Reply:
        # Else a fast child's report can join the parent's turn before its second round (steering).
        if user_texts(request)[0].startswith("Survey the logs"):
            await until(lambda: agents.asked.count("look into") >= 2, 10)
        return agents(request)

    llm.responder = child_answers_after_the_parents_turn
    async with open_chat(kind, store, chat_config(kind, llm, fake, tmp_path), fake) as chat:
        await chat.say("look into the logs")
        await chat.settle(lambda: "Survey result: 3 errors." in chat.texts())
        assert "I started a survey; I will tell you." in chat.texts()
    (task,) = await tasks_in_order(store)
    assert task.background and task.status == "done" and task.reported
    started = next(r for r in llm.requests if tool_results(r))
    assert "task #" in tool_results(started)[0] and "background" in tool_results(started)[0]
    report_turn = llm.requests[-1]
    assert user_texts(report_turn)[-1] == f"[Background task #{task.id} (survey) finished]\nThe logs show 3 errors."
    assert user_texts(report_turn)[0] == "look into the logs"  # the parent's own conversation, continued
    child_run = await store.runs.get(task.child_run_id)
    assert child_run.stage == "SUCCESS" and child_run.thread_key == f"task:{task.id}:"
    # What the child spent counts for the run that started it, like a foreground child's (it did not).
    parent = await store.runs.get(task.parent_run_id)
    alone = [r for r in await store.runs.list(session_id=parent.session_id) if r.id == parent.id][0]
    assert child_run.input_tokens > 0 and alone.input_tokens >= child_run.input_tokens
    events = await store.runs.events(parent.id)
    assert [e.payload["task_id"] for e in events if e.kind == "CHILD_RUN"] == [task.id]


# --- stopping ------------------------------------------------------------------------------


async def test_stop_during_a_parallel_batch_stops_the_parent_and_every_child(store, llm, kind, fake, tmp_path) -> None:
    agents = Agents()
    llm.responder = agents
    batch = tuple(delegate({"prompt": f"Job {n}: wait.", "name": f"job{n}"}, id=f"d{n}") for n in (1, 2, 3))
    agents.script("start the jobs", Reply(tool_calls=batch), Reply("never said"))
    for n in (1, 2, 3):
        agents.script(
            f"Job {n}",
            Reply(tool_calls=(FakeToolCall("shell", {"command": f"sleep 30; echo {n} > job{n}.txt"}, "s"),)),
            Reply("never said either"),
        )
    config = chat_config(kind, llm, fake, tmp_path, approvals=SHELL_ALLOWED)
    async with open_chat(kind, store, config, fake) as chat:
        await chat.say("start the jobs")

        async def running_shells() -> int:
            rows = await store.db.read(
                lambda conn: conn.exec_driver_sql(
                    "SELECT count(*) FROM tool_calls WHERE name = 'shell' AND status = 'running'"
                ).scalar()
            )
            return int(rows)

        for _ in range(1500):  # up to half a minute on a loaded machine
            if await running_shells() == 3:
                break
            await asyncio.sleep(0.02)
        assert await running_shells() == 3
        started = asyncio.get_running_loop().time()
        await chat.say("/stop")
        await chat.settle(lambda: "Stopped." in chat.texts())
        assert asyncio.get_running_loop().time() - started < 10  # the shells were killed, not waited for
        requests = len(llm.requests)
    assert requests == 4  # the parent's first call and each child's: nobody called the model again
    tasks = await tasks_in_order(store)
    assert [t.status for t in tasks] == ["canceled"] * 3
    for task in tasks:
        assert (await store.runs.get(task.child_run_id)).stage == "CANCELED"
    assert (await store.runs.get(tasks[0].parent_run_id)).stage == "CANCELED"
    assert not any(session_file(tmp_path / "ws", f"job{n}.txt").exists() for n in (1, 2, 3))
    assert "never said" not in " ".join(chat.texts())


async def test_a_shutdown_during_a_parallel_batch_suspends_it_and_the_restart_continues_it(
    store, llm, kind, fake, tmp_path
) -> None:
    agents = Agents()
    llm.responder = agents
    batch = (
        delegate({"prompt": "Half one.", "name": "one"}, id="d1"),
        delegate({"prompt": "Half two.", "name": "two"}, id="d2"),
    )
    agents.script("do the halves", Reply(tool_calls=batch), Reply("Both halves are done."))
    agents.script("Half one", Stall("working"), Reply("one result"))
    agents.script("Half two", Stall("working"), Reply("two result"))
    config = chat_config(kind, llm, fake, tmp_path, serve={"shutdown_grace": 0.2})
    async with open_chat(kind, store, config, fake) as chat:
        await chat.say("do the halves")
        for _ in range(1000):
            if agents.asked.count("Half one") and agents.asked.count("Half two"):
                break
            await asyncio.sleep(0.02)
    assert [t.status for t in await tasks_in_order(store)] == ["suspended", "suspended"]
    async with open_chat(kind, store, config, fake) as chat:
        await chat.settle(lambda: "Both halves are done." in chat.texts(), timeout=30)
    assert tool_results(llm.requests[-1]) == ["one result", "two result"]  # continued, not failed
    assert [t.status for t in await tasks_in_order(store)] == ["done", "done"]


# --- limits and bad arguments -------------------------------------------------------------


async def test_children_nest_to_the_depth_limit_and_the_answer_climbs_back(store, llm, kind, fake, tmp_path) -> None:
    agents = Agents()
    llm.responder = agents
    agents.script(
        "plan the trip",
        Reply(tool_calls=(delegate({"prompt": "Plan: book it.", "name": "planner", "tools": ["delegate", "clock"]}),)),
        Reply("Booked: seat 12A."),
    )
    agents.script(
        "Plan: book it",
        Reply(tool_calls=(delegate({"prompt": "Seat: pick one.", "name": "seats"}),)),
        Reply("planner: 12A"),
    )
    agents.script("Seat: pick one", Reply("12A"))
    async with open_chat(kind, store, chat_config(kind, llm, fake, tmp_path), fake) as chat:
        await chat.say("plan the trip")
        await chat.settle(lambda: "Booked: seat 12A." in chat.texts())
        assert any(t.startswith("🤖 planner → seats") for t in chat.texts())  # a grandchild is shown under its parent
    planner, seats = await tasks_in_order(store)
    assert (planner.depth, seats.depth) == (1, 2) and planner.tools == ["delegate", "clock"]
    by_agent = {user_texts(r)[0]: r for r in llm.requests}
    assert set(tool_names(by_agent["Plan: book it."])) == {"clock", "delegate"}  # the subset it was given
    assert "delegate" not in tool_names(by_agent["Seat: pick one."])  # at the depth limit (2): not offered
    assert tool_results(llm.requests[-1]) == ["planner: 12A"]
    tree = await store.delegations.tree(planner.parent_run_id)
    assert [(level, t.name) for level, t in tree] == [(1, "planner"), (2, "seats")]


async def test_a_delegate_call_with_tools_the_parent_lacks_gets_a_fix_the_arguments_result(
    store, llm, kind, fake, tmp_path
) -> None:
    agents = Agents()
    llm.responder = agents
    agents.script(
        "tidy up",
        Reply(tool_calls=(delegate({"prompt": "Tidy.", "tools": ["rm_everything"]}),)),
        Reply(tool_calls=(delegate({"prompt": "   "}, id="d2"),)),
        Reply("I could not hand that off."),
    )
    async with open_chat(kind, store, chat_config(kind, llm, fake, tmp_path), fake) as chat:
        await chat.say("tidy up")
        await chat.settle(lambda: "I could not hand that off." in chat.texts())
    first, second = tool_results(llm.requests[-1])
    assert "Invalid arguments for delegate: tasks[0].tools: rm_everything not available" in first
    assert "Fix the arguments and call delegate again." in first
    assert "Invalid arguments for delegate: tasks[0].prompt is empty" in second
    assert await tasks_in_order(store) == []  # no child was started


async def test_a_background_tasks_approval_does_not_hold_the_conversation(store, llm, kind, fake, tmp_path) -> None:
    agents = Agents()
    llm.responder = agents
    agents.script(
        "deploy",
        Reply(tool_calls=(delegate({"prompt": "Deploy it.", "name": "deployer"}, background=True),)),
        Reply("Deploying in the background."),
        Reply("The weather is fine."),
        Reply("Deployed, as the task reports."),
    )
    agents.script(
        "Deploy it",
        Reply(tool_calls=(FakeToolCall("shell", {"command": "echo up > deployed.txt"}, "s1"),)),
        Reply("It is up."),
    )
    async with open_chat(kind, store, chat_config(kind, llm, fake, tmp_path), fake) as chat:
        await chat.say("deploy the app")
        await chat.settle(lambda: bool(chat.prompts()) and "Deploying in the background." in chat.texts())
        (prompt,) = chat.prompts()
        assert "🤖 deployer → wants to run shell" in chat.prompt_text(prompt).replace("`", "")
        await chat.say("how is the weather?")  # answered while the task waits for its decision
        await chat.settle(lambda: "The weather is fine." in chat.texts())
        assert not session_file(tmp_path / "ws", "deployed.txt").exists()
        await chat.press(prompt, "Approve")
        await chat.settle(lambda: "Deployed, as the task reports." in chat.texts())
    assert session_file(tmp_path / "ws", "deployed.txt").read_text().strip() == "up"
    (task,) = await tasks_in_order(store)
    assert (task.status, task.result, task.reported) == ("done", "It is up.", True)


async def test_stop_reaches_a_running_background_task_which_reports_it_was_stopped(
    store, llm, kind, fake, tmp_path
) -> None:
    agents = Agents()
    llm.responder = agents
    agents.script(
        "crunch",
        Reply(tool_calls=(delegate({"prompt": "Crunch the numbers.", "name": "cruncher"}, background=True),)),
        Reply("Crunching."),
        Reply("The cruncher was stopped."),
    )
    agents.script("Crunch the numbers", Stall("crunching"))
    async with open_chat(kind, store, chat_config(kind, llm, fake, tmp_path), fake) as chat:
        await chat.say("crunch the numbers")
        await asyncio.wait_for(llm.stalled.wait(), 15)
        await chat.wait(lambda: "Crunching." in chat.texts())  # the parent answered; the task still runs
        await chat.say("/stop")
        await chat.settle(lambda: "The cruncher was stopped." in chat.texts())
    (task,) = await tasks_in_order(store)
    assert task.status == "canceled" and (await store.runs.get(task.child_run_id)).stage == "CANCELED"
    assert user_texts(llm.requests[-1])[-1].startswith(f"[Background task #{task.id} (cruncher) was stopped]")
