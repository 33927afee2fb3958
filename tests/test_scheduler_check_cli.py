"""`gateway jobs add` with a check, `gateway jobs test`, a bad check value as one line, and the
agent's `schedule` tool kept within what its creator may run."""

from __future__ import annotations

import hashlib
import io
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers import needs_bwrap
from test_scheduler_cli import CHAT, parse
from test_scheduler_support import Core

from gateway.config import AgentConfig, Config, JobConfig, SchedulerConfig
from gateway.jobs.checks import JobChecks, job_dir
from gateway.tools import InMemoryNotes, ToolContext, run_tool
from scheduler.cli import run_jobs_command
from scheduler.definitions import DefinitionError, to_schedule
from scheduler.jobs import schedule_repo
from scheduler.tools import schedule_tool


async def jobs(store, tmp_path: Path, *argv: str) -> tuple[int, str, str, Core]:  # noqa: ANN001
    out, err, core = io.StringIO(), io.StringIO(), Core(store)
    config = Config(agent={"workspace": str(tmp_path / "ws")})
    checks = JobChecks(config.agent)
    code = await run_jobs_command(parse(*argv), store, config, core.submit, out=out, err=err, checks=checks)
    return code, out.getvalue(), err.getvalue(), core


@needs_bwrap
async def test_jobs_add_takes_a_check_and_jobs_test_says_whether_the_model_would_wake(store, tmp_path):
    code, out, err, _ = await jobs(
        store, tmp_path, "add", "inbox-watch", "--tick", "30m", "--prompt", "Tell me what is urgent.",
        "--check-command", "cat unread.txt", "--wake-when", "changed", "--check-timeout", "10s",
        "--idle-max-every", "4h", "--check-failures-before-report", "5",
    )
    assert code == 0, err
    job = await schedule_repo(store).by_name("inbox-watch")
    assert job.check_spec == {
        "command": "cat unread.txt", "wake_when": "changed", "timeout_s": 10, "max_output": 16384, "network": False,
    }
    assert (job.idle_max_every, job.check_failures_before_report) == ("4h", 5)

    (job_dir(AgentConfig(workspace=str(tmp_path / "ws")), "inbox-watch") / "unread.txt").write_text("Ann: urgent\n")
    code, out, _, core = await jobs(store, tmp_path, "test", "inbox-watch")
    assert code == 0
    assert "check of inbox-watch: command, wake when changed, timeout 10s" in out
    assert "different from the last check's" in out and "the model would wake" in out and "| Ann: urgent" in out
    assert core.submitted == [] and await schedule_repo(store).count_runs(job.id) == 0  # no firing, no session
    assert (await schedule_repo(store).state(job.id)).output_hash is None  # nothing stored: the next firing wakes

    await schedule_repo(store).save_state(job.id, output_hash=hashlib.sha256(b"Ann: urgent\n").hexdigest())
    code, out, _, _ = await jobs(store, tmp_path, "test", "inbox-watch")
    assert "the same as the last check's" in out and "would not wake" in out and "skipped (no change)" in out

    code, out, _, _ = await jobs(store, tmp_path, "show", "inbox-watch")
    assert "check:       command, wake when changed, timeout 10s" in out


@needs_bwrap
async def test_jobs_test_of_a_failing_check_says_why_and_exits_1(store, tmp_path):
    await jobs(store, tmp_path, "add", "broken", "--every", "1h", "--prompt", "p", "--check-command", "exit 4")
    code, out, _, _ = await jobs(store, tmp_path, "test", "broken")
    assert code == 1 and "failed: the command exited 4: no output" in out and "told once at 3" in out


@pytest.mark.parametrize(
    "argv, expected",
    [
        (("--check-mcp", "mail"), "--check-mcp 'mail': use SERVER:TOOL"),
        (("--check-mcp", "mail:unread", "--check-args", "{oops"), "--check-args is not JSON"),
        (("--wake-when", "nonempty"), "--wake-when without a check"),
        (("--check-url", "ftp://example.com/x"), "check.url 'ftp://example.com/x': use an http:// or https:// URL"),
        (("--check-url", "https://example.com", "--wake-when", "exit_zero"), "exit_zero is for a command check"),
        (("--check-url", "https://example.com", "--check-network"), "check.network is for a command check"),
        (("--check-command", "true", "--check-timeout", "2h"), "check.timeout: must be between 1s and 10m"),
        (("--check-failures-before-report", "2",), "the job has no check"),
        (("--idle-max-every", "4h"), "idle_backoff needs a check or a checklist"),
    ],
)
async def test_a_bad_check_is_one_line_naming_the_setting_and_the_fix(sqlite_store, tmp_path, argv, expected):
    code, _, err, _ = await jobs(sqlite_store, tmp_path, "add", "bad", "--every", "1h", "--prompt", "p", *argv)
    assert code == 1 and expected in err and len(err.strip().splitlines()) == 1, err
    assert await schedule_repo(sqlite_store).list() == []


def test_a_config_check_needs_exactly_one_source():
    both = JobConfig(name="x", every="1h", prompt="p", check={"command": "true", "url": "https://example.com"})
    with pytest.raises(DefinitionError, match="exactly one of command, url or mcp"):
        to_schedule(both, SchedulerConfig(), source="config", now=datetime.now(UTC))


# ---- the agent's schedule tool ----------------------------------------------------------------------
def tool_ctx(tmp_path: Path, **agent) -> ToolContext:  # noqa: ANN003
    return ToolContext(
        session_id=1, thread=CHAT, source="telegram", interactive=True, workspace=tmp_path,
        agent=AgentConfig(workspace=str(tmp_path), **agent), notes=InMemoryNotes(), person="telegram:42",
    )


async def test_the_agent_can_add_a_check_but_not_more_network_than_the_shell_has(sqlite_store, tmp_path):
    spec = schedule_tool(sqlite_store, SchedulerConfig(), may_use=lambda person, tool: True)
    args = {
        "action": "create", "name": "watch", "every": "30m", "prompt": "Tell me about new releases.",
        "check": {"command": "curl -s https://example.com/releases", "wake_when": "changed"},
    }
    outcome = await run_tool(spec, args, tool_ctx(tmp_path, tools=["shell", "schedule"]))
    assert not outcome.failed, outcome.text
    job = await schedule_repo(sqlite_store).by_name("watch")
    assert job.check_spec["command"].startswith("curl") and job.check_spec["network"] is False

    args["name"], args["check"] = "watch2", {"command": "true", "network": True}  # not a parameter it has
    await run_tool(spec, args, tool_ctx(tmp_path, tools=["shell", "schedule"]))
    assert (await schedule_repo(sqlite_store).by_name("watch2")).check_spec["network"] is False

    args["name"] = "watch3"  # where the operator lets the shell reach the network, so may its checks
    await run_tool(spec, args, tool_ctx(tmp_path, tools=["shell", "schedule"], shell_network=True))
    assert (await schedule_repo(sqlite_store).by_name("watch3")).check_spec["network"] is True


async def test_the_agent_cannot_add_a_command_check_without_the_shell_or_the_role(sqlite_store, tmp_path):
    args = {"action": "create", "name": "w", "every": "30m", "prompt": "p", "check": {"command": "cat ~/.ssh/id_rsa"}}
    plain = schedule_tool(sqlite_store, SchedulerConfig())
    no_shell = await run_tool(plain, args, tool_ctx(tmp_path, tools=["schedule"]))
    assert no_shell.failed and "needs the shell" in no_shell.text
    denied = schedule_tool(sqlite_store, SchedulerConfig(), may_use=lambda person, tool: tool != "shell")
    refused = await run_tool(denied, args, tool_ctx(tmp_path, tools=["shell", "schedule"]))
    assert refused.failed and "needs shell, which your role may not use" in refused.text
    assert await schedule_repo(sqlite_store).list() == []
