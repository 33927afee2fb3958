"""`gateway jobs ...` and the agent's `schedule` tool."""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import pytest
from test_scheduler_support import Core

from gateway.config import AgentConfig, Config, JobConfig, SchedulerConfig
from gateway.events import ThreadKey
from gateway.tools import InMemoryNotes, ToolContext, ToolRegistry, run_tool
from scheduler.cli import add_parser, run_jobs_command
from scheduler.jobs import schedule_repo
from scheduler.tools import NOT_HERE, schedule_tool

CHAT = ThreadKey("telegram", "-1001", "5")


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gateway")
    add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["jobs", *argv])


async def jobs(store, *argv: str, config: Config | None = None) -> tuple[int, str, str, Core]:
    out, err, core = io.StringIO(), io.StringIO(), Core(store)
    code = await run_jobs_command(parse(*argv), store, config or Config(), core.submit, out=out, err=err)
    return code, out.getvalue(), err.getvalue(), core


async def test_add_list_show_and_remove(sqlite_store):
    code, out, err, _ = await jobs(
        sqlite_store, "add", "standup", "--cron", "0 9 * * 1-5", "--prompt", "Prepare the standup notes",
        "--deliver-to", "slack:C42", "--timezone", "Europe/Berlin", "--timeout", "10m",
    )
    assert code == 0 and "added standup" in out, err
    stored = await schedule_repo(sqlite_store).by_name("standup")
    assert (stored.kind, stored.spec, stored.timezone, stored.timeout_s, stored.source) == (
        "cron",
        "0 9 * * 1-5",
        "Europe/Berlin",
        600,
        "cli",
    )

    code, out, _, _ = await jobs(sqlite_store, "list")
    assert code == 0 and "standup" in out and "slack:C42" in out and "CE" in out  # next firing in CET/CEST

    code, out, _, _ = await jobs(sqlite_store, "show", "standup")
    assert code == 0 and "no firings yet" in out and "Prepare the standup notes" in out

    code, out, _, _ = await jobs(sqlite_store, "remove", "standup")
    assert code == 0 and await schedule_repo(sqlite_store).by_name("standup") is None


async def test_bad_input_is_answered_clearly_and_changes_nothing(sqlite_store):
    code, _, err, _ = await jobs(sqlite_store, "add", "x", "--cron", "61 * * * *", "--prompt", "p")
    assert code == 1 and "cron" in err
    code, _, err, _ = await jobs(sqlite_store, "add", "x", "--every", "30m", "--prompt", "p", "--deliver-to", "irc:#x")
    assert code == 1 and "deliver_to" in err
    code, _, err, _ = await jobs(sqlite_store, "show", "ghost")
    assert code == 1 and "no job named 'ghost'" in err
    assert await schedule_repo(sqlite_store).list() == []
    await jobs(sqlite_store, "add", "dup", "--every", "1h", "--prompt", "p")
    code, _, err, _ = await jobs(sqlite_store, "add", "dup", "--every", "2h", "--prompt", "q")
    assert code == 1 and "already exists" in err
    assert (await schedule_repo(sqlite_store).by_name("dup")).spec == "1h"


async def test_disable_enable_run_now_show_and_kill(sqlite_store):
    await jobs(sqlite_store, "add", "digest", "--every", "1h", "--prompt", "Digest", "--deliver-to", "telegram:7")
    code, out, _, _ = await jobs(sqlite_store, "disable", "digest")
    assert code == 0 and "digest disabled" in out
    assert not (await schedule_repo(sqlite_store).by_name("digest")).enabled
    code, out, _, _ = await jobs(sqlite_store, "enable", "digest")
    assert "digest enabled" in out

    code, out, _, core = await jobs(sqlite_store, "run-now", "digest")
    assert code == 0 and "queued" in out
    [message] = core.submitted
    assert message.text == "Digest" and message.thread.channel == "cron"

    code, out, _, _ = await jobs(sqlite_store, "run-now", "digest")
    assert code == 1  # still running: recorded as skipped, not started twice

    code, out, _, _ = await jobs(sqlite_store, "show", "digest")
    assert "running" in out and "skipped" in out and "manual" in out

    code, out, _, _ = await jobs(sqlite_store, "kill", "digest")
    assert code == 0 and "#" in out  # queued prompt dropped, run canceled
    code, out, _, _ = await jobs(sqlite_store, "kill", "digest")
    assert "not running" in out


async def test_config_jobs_are_visible_to_the_cli_before_the_gateway_ever_ran(sqlite_store):
    config = Config(scheduler=SchedulerConfig(jobs=[JobConfig(name="from-file", every="6h", prompt="p")]))
    code, out, _, _ = await jobs(sqlite_store, "list", config=config)
    assert code == 0 and "from-file" in out


# ---- the agent tool ---------------------------------------------------------------------------


def ctx(tmp_path: Path, *, interactive: bool = True, source: str = "telegram", thread: ThreadKey = CHAT) -> ToolContext:
    return ToolContext(
        session_id=1, thread=thread, source=source, interactive=interactive, workspace=tmp_path,
        agent=AgentConfig(workspace=str(tmp_path)), notes=InMemoryNotes(),
    )


async def test_the_tool_is_refused_in_a_scheduled_session(sqlite_store, tmp_path):
    spec = schedule_tool(sqlite_store, SchedulerConfig())
    for context in (
        ctx(tmp_path, interactive=False, source="cron"),
        ctx(tmp_path, interactive=False, source="tick"),
        ctx(tmp_path, source="cron"),
    ):
        outcome = await run_tool(spec, {"action": "create", "name": "x", "every": "1h", "prompt": "p"}, context)
        assert outcome.failed and outcome.text == NOT_HERE
    assert await schedule_repo(sqlite_store).list() == []


async def test_the_tool_creates_lists_and_cancels_jobs_of_this_thread(sqlite_store, tmp_path):
    changes = []

    async def on_change():
        changes.append(1)

    registry = ToolRegistry(
        [schedule_tool(sqlite_store, SchedulerConfig(timezone="Europe/Berlin"), on_change=on_change)]
    )
    spec = registry.get("schedule")
    here = ctx(tmp_path)
    created = await run_tool(
        spec, {"action": "create", "name": "water", "cron": "0 */2 * * *", "prompt": "Remind me to drink"}, here
    )
    assert not created.failed and "water" in created.text and "posted in this conversation" in created.text
    job = await schedule_repo(sqlite_store).by_name("water")
    assert (job.deliver_to, job.source, job.timezone, job.created_by) == (
        "telegram:-1001:5",
        "agent",
        "Europe/Berlin",
        str(CHAT),
    )
    assert changes == [1]

    elsewhere = ctx(tmp_path, thread=ThreadKey("slack", "C1", "9.9"))
    assert "No jobs" in (await run_tool(spec, {"action": "list"}, elsewhere)).text
    assert "water" in (await run_tool(spec, {"action": "list"}, here)).text
    foreign = await run_tool(spec, {"action": "cancel", "name": "water"}, elsewhere)
    assert foreign.failed and await schedule_repo(sqlite_store).by_name("water") is not None

    cancelled = await run_tool(spec, {"action": "cancel", "name": "water"}, here)
    assert not cancelled.failed and await schedule_repo(sqlite_store).by_name("water") is None
    assert changes == [1, 1]


@pytest.mark.parametrize(
    "args, expected",
    [
        ({"action": "create", "name": "bad", "cron": "every day", "prompt": "p"}, "cron"),
        ({"action": "create", "name": "bad", "prompt": "p"}, "needs"),
        ({"action": "create", "name": "bad", "at": "2001-01-01T00:00", "prompt": "p"}, "in the past"),
        ({"action": "create", "name": "", "every": "1h", "prompt": "p"}, "name"),
        ({"action": "explode"}, "action must be"),
    ],
)
async def test_the_tool_answers_bad_arguments_with_a_fix(sqlite_store, tmp_path, args, expected):
    outcome = await run_tool(schedule_tool(sqlite_store, SchedulerConfig()), args, ctx(tmp_path))
    assert outcome.failed and expected in outcome.text
    assert await schedule_repo(sqlite_store).list() == []


async def test_the_tool_cannot_deliver_to_the_console(sqlite_store, tmp_path):
    outcome = await run_tool(
        schedule_tool(sqlite_store, SchedulerConfig()),
        {"action": "list"},
        ctx(tmp_path, source="console", thread=ThreadKey("console", "local", "")),
    )
    assert outcome.failed and "Telegram or Slack" in outcome.text


def test_the_parser_takes_common_options_after_the_action_and_sets_the_handler():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config")
    parser = argparse.ArgumentParser(prog="gateway")

    async def handler(args, config):
        return 0

    add_parser(parser.add_subparsers(dest="command"), parents=[common], handler=handler)
    args = parser.parse_args(["jobs", "run-now", "digest", "--config", "other.yml"])
    assert (args.jobs_command, args.name, args.config, args.handler) == ("run-now", "digest", "other.yml", handler)
    with pytest.raises(SystemExit):
        parser.parse_args(["jobs", "add", "x", "--prompt", "p"])  # a timing option is required
