"""Roles cannot be widened (docs/security.md, "Who may run what" 3): a job made with `schedule`
runs with its creator's role, not as the trusted `cron` channel; a turn continued after a
restart keeps the identity of the person who asked; `delegate` goes through the gate like any
tool; a scheduled run's sub-agents carry its job (its `scope: job` caps count them)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fakes.channel import FakeChannel
from fakes.llm import FakeLLM, FakeToolCall, Reply, Stall, user_texts
from harness import ALICE, BOB, make_config, running_gateway
from helpers import tool_results
from security_support import written
from subagent_chat import Agents, delegate

from gateway.events import Sender, ThreadKey
from gateway.store.tables import budget_counters

CAROL = Sender("300", "Carol", "carol")
ALICE_DM = ThreadKey("telegram", ALICE.id, "")
NO_SHELL = {"roles": {"member": {"deny_tools": ["shell"]}}}


def offered(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools") or []}


def refused(request: dict[str, Any]) -> set[str]:
    """The tools the request's tail says this turn's people may not use. The tools array is the
    same whoever asks (a provider caches it with the prompt); a call of one of these is refused
    by name at the gate."""
    tail = str(request["messages"][-1]["content"])
    marker = "does not allow them): "
    if marker not in tail:
        return set()
    return set(tail.split(marker, 1)[1].split(".\n")[0].rstrip(".").split(", "))


async def test_a_job_made_with_schedule_runs_with_its_creators_role(store, tmp_path) -> None:
    agents = Agents()
    agents.script("plan it", Reply(tool_calls=(FakeToolCall("schedule", {
        "action": "create", "name": "later", "prompt": "Later: clean up with the shell.", "in": "1h"}, "c1"),)),
        Reply("Scheduled."))
    agents.script("Later", Reply("Nothing to do."))
    async with FakeLLM(responder=agents) as llm:
        config = make_config(
            llm.base_url, str(tmp_path / "ws"), scheduler={"enabled": True},
            access={**NO_SHELL, "dm_policy": "open"}, approvals={"rules": [{"tool": "schedule", "action": "allow"}]},
        )
        async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
            await h.say("plan it", thread=ALICE_DM)
            await h.idle()
            assert "shell" in refused(llm.requests[0])  # a member's own turn
            schedule = await store.schedules.by_name("later")
            assert schedule is not None and schedule.created_by == f"telegram:{ALICE.id}"
            await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
            await h.idle()
            job_request = next(r for r in llm.requests if user_texts(r)[0].startswith("Later"))
            assert "shell" in refused(job_request)  # not the trusted scheduler's everything


async def test_a_forced_shell_call_in_a_members_job_is_refused_by_the_role(store, tmp_path) -> None:
    agents = Agents()
    agents.script("plan it", Reply(tool_calls=(FakeToolCall("schedule", {
        "action": "create", "name": "later", "prompt": "Later: run it.", "in": "1h"}, "c1"),)), Reply("Scheduled."))
    agents.script("Later", Reply(tool_calls=(FakeToolCall("shell", {"command": "echo x > pwned.txt"}, "s1"),)),
                  Reply("done"))
    async with FakeLLM(responder=agents) as llm:
        config = make_config(
            llm.base_url, str(tmp_path / "ws"), scheduler={"enabled": True}, access={**NO_SHELL, "dm_policy": "open"},
            approvals={"rules": [{"tool": "schedule", "action": "allow"}, {"tool": "shell", "action": "allow"}]},
        )
        async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
            await h.say("plan it", thread=ALICE_DM)
            await h.idle()
            schedule = await store.schedules.by_name("later")
            await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
            await h.idle()
        last = next(r for r in reversed(llm.requests) if user_texts(r)[0].startswith("Later"))
        assert tool_results(last) == ["Tool call denied: the role 'member' may not use 'shell'."]
        assert not written(tmp_path, "pwned.txt")


async def test_a_turn_continued_after_a_restart_keeps_the_askers_identity(store, tmp_path) -> None:
    group = ThreadKey("fake", "group1", "")
    async with FakeLLM() as llm:
        config = make_config(llm.base_url, str(tmp_path / "ws"), access=NO_SHELL,
                             approvals={"admins": {"fake": [CAROL.id]}})
        llm.reply("hello Carol")
        async with running_gateway(store, config) as h:
            await h.say("hi", thread=group, sender=CAROL)  # the admin starts the session
            await h.idle()
            assert "shell" in offered(llm.requests[0]) and not refused(llm.requests[0])
            llm.stall()
            await h.say("now me", thread=group, sender=BOB)  # a member's turn, cut by the shutdown
            await h.wait_for(lambda: llm.stalled.is_set())
        assert (await store.sessions.current(str(group))).started_by == CAROL.id
        llm.reply("continued")
        async with running_gateway(store, config) as h:
            await h.wait_for(lambda: "continued" in h.channel.messages(group))
        assert len(llm.requests) == 3 and "shell" in refused(llm.requests[-1])  # Bob's role, not Carol's


async def test_delegate_goes_through_the_roles_and_the_rules(store, tmp_path) -> None:
    agents = Agents()
    agents.script("hand it off", Reply(tool_calls=(delegate({"prompt": "Child: run the shell."}),)),
                  Reply("handed"))
    agents.script("Child", Reply("child ran"))
    async with FakeLLM(responder=agents) as llm:
        config = make_config(llm.base_url, str(tmp_path / "ws"),
                             access={"roles": {"member": {"deny_tools": ["delegate"]}}})
        async with running_gateway(store, config) as h:
            await h.say("hand it off")
            await h.idle()
        assert "delegate" in refused(llm.requests[0])
        assert tool_results(llm.requests[-1]) == ["Tool call denied: the role 'member' may not use 'delegate'."]
        assert not [r for r in llm.requests if user_texts(r)[0].startswith("Child")]

    agents.script("hand it off", Reply(tool_calls=(delegate({"prompt": "Child: run the shell."}, id="d2"),
                                                   delegate({"prompt": "Child: and again."}, id="d3"))),
                  Reply("handed"))
    async with FakeLLM(responder=agents) as llm:
        config = make_config(llm.base_url, str(tmp_path / "ws2"),
                             approvals={"rules": [{"tool": "delegate", "action": "deny"}]})
        async with running_gateway(store, config) as h:
            await h.say("hand it off", thread=ThreadKey("fake", "chat2", ""))
            await h.idle()
        assert tool_results(llm.requests[-1]) == ["Tool call denied by approval policy (approvals.rules[0])."] * 2
        assert not [r for r in llm.requests if user_texts(r)[0].startswith("Child")]


async def test_a_scheduled_runs_children_carry_its_job(store, tmp_path) -> None:
    agents = Agents()
    agents.script("Nightly", Reply(tool_calls=(delegate({"prompt": "Child: count."}),)), Reply("report"))
    agents.script("Child", Reply("counted"))
    job = {"name": "nightly", "cron": "0 3 * * *", "prompt": "Nightly: count.", "deliver_to": "telegram:900"}
    async with FakeLLM(responder=agents) as llm:
        config = make_config(llm.base_url, str(tmp_path / "ws"), scheduler={"enabled": True, "jobs": [job]},
                             budgets={"caps": [{"scope": "job", "period": "day", "tokens": 1_000_000}]})
        async with running_gateway(store, config, FakeChannel(name="telegram")) as h:
            schedule = await store.schedules.by_name("nightly")
            await h.gateway.scheduler.fire(schedule.id, datetime.now(UTC))
            await h.idle()
            runs = await store.runs.list()
            sessions = [await store.sessions.get(r.session_id) for r in runs]
            assert sorted(s.kind for s in sessions) == ["child", "cron"]
            assert {s.schedule_id for s in sessions} == {schedule.id}
            counters = [c for c in await store.db.read(_all_counters) if c.scope == "job"]
            parent = next(r for s, r in zip(sessions, runs, strict=True) if s.kind == "cron")
            # the job's counter holds every call of the run, its child's too (the parent's run is charged them)
            assert [c.used_tokens for c in counters] == [parent.input_tokens + parent.output_tokens]


def _all_counters(conn):  # noqa: ANN001, ANN202
    return conn.execute(budget_counters.select()).all()


async def test_children_count_against_max_concurrent_turns(store, tmp_path) -> None:
    """With one turn at a time, a parent's two children run one after the other: the first
    stalls, so the second never starts before the /stop that ends them both."""
    agents = Agents()
    agents.script("split it", Reply(tool_calls=(delegate({"prompt": "First: wait."}, {"prompt": "Second: go."}),)),
                  Reply("split"))
    agents.script("First", Stall())
    agents.script("Second", Reply("second done"))
    async with FakeLLM(responder=agents) as llm:
        config = make_config(llm.base_url, str(tmp_path / "ws"), inbox={"max_concurrent_turns": 1},
                             agent={"max_parallel_children": 2})
        async with running_gateway(store, config) as h:
            await h.say("split it")
            await h.wait_for(lambda: llm.stalled.is_set())
            await h.say("/stop")
            await h.idle()
        assert [user_texts(r)[0][:5] for r in llm.requests] == ["split", "First"]


async def test_a_tool_in_the_array_that_the_members_role_denies_is_refused_by_name(store, tmp_path) -> None:
    """The tools array is the same whoever asks (a provider caches it with the prompt), so a
    member's request carries tools their role denies: a call of one is refused at the gate,
    by name, however the model was led to it, and nothing runs."""
    group = ThreadKey("fake", "group1", "")
    no_writes = {"roles": {"member": {"deny_tools": ["write_file"]}}}
    async with FakeLLM() as llm:
        config = make_config(
            llm.base_url, str(tmp_path / "ws"), access=no_writes, approvals={
                "admins": {"fake": [CAROL.id]}, "rules": [{"tool": "write_file", "action": "allow"}]},
        )
        async with running_gateway(store, config) as h:
            llm.reply("hello")
            await h.say("hi", thread=group, sender=CAROL)  # the admin: write_file is hers to use
            await h.idle()
            llm.tool_call("write_file", {"path": "pwned.txt", "content": "x"}, id="w1")
            llm.reply("tried")
            await h.say("write it", thread=group, sender=BOB)  # a member
            await h.idle()
    admins, members = llm.requests[0], llm.requests[1]
    assert offered(admins) == offered(members) and "write_file" in offered(members)  # the same array
    assert "write_file" in refused(members) and not refused(admins)  # the model is told, in the tail
    assert tool_results(llm.requests[-1]) == ["Tool call denied: the role 'member' may not use 'write_file'."]
    assert not written(tmp_path, "pwned.txt")
    (denied,) = [a for a in await store.audit.list_audit(tool="write_file") if a.action == "denied"]
    assert denied.actor == f"fake:{BOB.id}"
