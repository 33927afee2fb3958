"""`gateway status` and `gateway doctor` through the real command line, against the fake Bot API,
the fake Slack Web API and the scripted model server: status shows every part on one screen (and
as JSON), doctor names what is wrong in one line with its fix and exits non-zero."""

from __future__ import annotations

import asyncio
import json
import socket
import sys
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import NO_POSTGRES, POSTGRES_URL
from fakes.llm import FakeLLM
from fakes.slack import FakeSlack
from fakes.telegram import BOT_USERNAME, FakeTelegram
from test_chat_cli import child_env

from gateway.config import SchedulerConfig
from gateway.events import utcnow
from gateway.store import Store
from gateway.store.db import SCHEMA_REVISION
from scheduler.definitions import job_config, to_schedule

REPO = Path(__file__).resolve().parent.parent


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_config(path: Path, database_url: str, llm_url: str, *, extra: str = "") -> Path:
    path.write_text(
        f"database:\n  url: {database_url}\n"
        f"llm:\n  base_url: {llm_url}\n  model: m\n  max_retries: 0\n"
        f"agent:\n  workspace: {path.parent / 'workspace'}\n" + extra
    )
    return path


def channels_section(tg: FakeTelegram, slack: FakeSlack) -> str:
    return f"telegram:\n  api_base_url: {tg.base_url}\nslack:\n  api_base_url: {slack.base_url}\n"


def channel_env(tg: FakeTelegram, slack: FakeSlack, **changes: str) -> dict[str, str]:
    env = {"TELEGRAM_BOT_TOKEN": tg.token, "SLACK_BOT_TOKEN": slack.token, "SLACK_APP_TOKEN": slack.app_token}
    return {**env, **changes}


NIGHTLY = "scheduler:\n  jobs:\n    - name: nightly\n      cron: '{cron}'\n      prompt: Sum up the day.\n"


async def gateway(config: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """`gateway <args> --config <config>` in a child process; the fakes answer on this loop."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", *args, "--config", str(config), "--log-level", "error",
        cwd=config.parent, env={**child_env(), **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def line_of(out: str, start: str) -> str:
    found = [line for line in out.splitlines() if line.startswith(start)]
    assert len(found) == 1, f"no single line starting {start!r} in:\n{out}"
    return found[0]


async def seed(url: str) -> None:
    """What a running gateway leaves in its database: two instances (one the leader), a tool
    call waiting for approval, a stranger waiting for pairing, a job made from the chat."""
    store = Store(url)
    try:
        await store.migrate()
        await store.inbox.acquire("leader", "host-a:1", 120)
        for instance in ("host-a:1", "host-b:2"):
            await store.inbox.acquire(f"instance:{instance}", instance, 120)
        session = await store.sessions.open("telegram:42", source="telegram")
        await store.prompts.create(
            kind="approval", session_id=session.id, thread_key="telegram:42", payload={"tool": "shell"},
            requested_by="42", expires_at=utcnow() + timedelta(hours=1),
        )
        await store.access.request(
            kind="user", channel="telegram", subject="77", name="Sam", thread_key="telegram:77", ttl_s=600,
            max_pending=10,
        )
        weekly = job_config({"name": "weekly", "cron": "0 8 * * 1", "prompt": "Plan the week."})
        await store.schedules.create(to_schedule(weekly, SchedulerConfig(), source="cli", now=utcnow()))
    finally:
        await store.close()


# --- status -----------------------------------------------------------------------------------


async def test_status_shows_every_part_on_one_screen_and_as_json(database_url, tmp_path):
    async with FakeLLM(server_kind="vllm", context_window=32_768) as llm, FakeTelegram() as tg, FakeSlack() as slack:
        await seed(database_url)
        mcp = (
            "mcp:\n  servers:\n"
            f"    local:\n      command: [{sys.executable}, -c, 'pass']\n"
            f"    remote:\n      url: {slack.url}/mcp\n"
        )
        config = write_config(
            tmp_path / "config.yml", database_url, llm.base_url,
            extra=channels_section(tg, slack) + NIGHTLY.format(cron="0 3 * * *") + mcp,
        )
        code, out, err = await gateway(config, "status", env=channel_env(tg, slack))
        code_json, out_json, _ = await gateway(config, "status", "--json", env=channel_env(tg, slack))

    assert code == 0, out + err
    assert version("chat-gateway") in out.splitlines()[0]
    assert str(config) in line_of(out, "config")
    assert f"schema {SCHEMA_REVISION} (current)" in line_of(out, "database")
    telegram = line_of(out, "telegram")
    assert "connected" in telegram and f"@{BOT_USERNAME}" in telegram and "polling" in telegram
    slack_line = line_of(out, "slack")
    assert "connected" in slack_line and "gateway" in slack_line and "socket mode" in slack_line
    model = line_of(out, "model")
    assert "reachable" in model and "m" in model and "32,768 tokens" in model
    assert line_of(out, "sandbox")
    mcp_line = line_of(out, "mcp")
    assert "local" in mcp_line and "remote" in mcp_line and "not started" in mcp_line
    instances = line_of(out, "instances")
    assert "2 running" in instances and "host-a:1 (leader)" in instances and "host-b:2" in instances
    jobs = line_of(out, "jobs")
    assert "nightly" in jobs and "weekly" in jobs and "next" in jobs
    assert "1 pending" in line_of(out, "approvals") and "shell" in line_of(out, "approvals")
    pairing = line_of(out, "pairing")
    assert "1 waiting" in pairing and "gateway pairing approve" in pairing
    claims = [line for line in out.splitlines() if line.startswith("claim")]  # no admin yet: the owner's codes
    assert len(claims) == 2 and "/start " in claims[0] + claims[1], out

    assert code_json == 0
    status = json.loads(out_json)
    assert status["version"] == version("chat-gateway") and status["config"] == str(config)
    assert status["database"]["revision"] == SCHEMA_REVISION and status["database"]["current"] is True
    by_channel = {c["name"]: c for c in status["channels"]}
    assert by_channel["telegram"] | {"error": ""} == {
        "name": "telegram", "connected": True, "bot": f"@{BOT_USERNAME}", "mode": "polling", "error": "",
    }
    assert by_channel["slack"]["connected"] is True and by_channel["slack"]["mode"] == "socket"
    assert status["model_server"]["reachable"] is True and status["model_server"]["window"] == 32_768
    assert {s["name"]: s["reachable"] for s in status["mcp"]} == {"local": True, "remote": True}
    assert status["leader"] == "host-a:1"
    assert sorted(i["id"] for i in status["instances"]) == ["host-a:1", "host-b:2"]
    assert {j["name"] for j in status["jobs"] if j["next"]} == {"nightly", "weekly"}
    assert status["approvals"]["pending"] == 1 and status["pairing"]["pending"] == 1
    assert len(status["claim"]) == 2 and all(line.startswith("claim") for line in status["claim"])
    assert status["ok"] is True


async def test_status_says_what_is_down_and_exits_non_zero(tmp_path):
    """Nothing started yet, the model server not running, a wrong bot token: each said on its
    line, the rest still shown."""
    async with FakeTelegram() as tg:
        config = write_config(
            tmp_path / "config.yml", f"sqlite:///{tmp_path / 'data' / 'gateway.db'}",
            f"http://127.0.0.1:{closed_port()}/v1", extra=f"telegram:\n  api_base_url: {tg.base_url}\n",
        )
        code, out, err = await gateway(config, "status", env={"TELEGRAM_BOT_TOKEN": "123:wrong"})
        _, out_json, _ = await gateway(config, "status", "--json", env={"TELEGRAM_BOT_TOKEN": "123:wrong"})

    assert code == 1, out + err
    assert "not created yet" in line_of(out, "database")
    assert not (tmp_path / "data" / "gateway.db").exists()  # status only reads
    assert "refused the bot token" in line_of(out, "telegram") and "TELEGRAM_BOT_TOKEN" in line_of(out, "telegram")
    assert "unreachable" in line_of(out, "model")
    assert "none running" in line_of(out, "instances")
    status = json.loads(out_json)
    assert status["ok"] is False and status["model_server"]["reachable"] is False
    assert status["channels"][0]["connected"] is False


async def test_status_with_the_database_unreachable_says_so_in_seconds(tmp_path):
    async with FakeLLM() as llm:
        url = f"postgresql+asyncpg://postgres@127.0.0.1:{closed_port()}/gateway"
        config = write_config(tmp_path / "config.yml", url, llm.base_url)
        started = asyncio.get_running_loop().time()
        code, out, err = await gateway(config, "status")
        took = asyncio.get_running_loop().time() - started
    assert code == 1, out + err
    database = line_of(out, "database")
    assert "cannot connect" in database and "database.url" in database
    assert "unknown" in line_of(out, "instances")
    assert took < 60  # a refused connection is not waited on as a timeout


async def test_a_schema_behind_is_said_by_status_and_refused_by_doctor_without_auto_migrate(tmp_path):
    url = f"sqlite:///{tmp_path / 'gateway.db'}"
    store = Store(url)
    try:
        await store.migrate()
        await store.db.write(lambda conn: conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0020'"))
    finally:
        await store.close()
    async with FakeLLM() as llm:
        config = write_config(tmp_path / "config.yml", url, llm.base_url, extra="")
        config.write_text(config.read_text().replace("database:\n", "database:\n  auto_migrate: false\n", 1))
        code, out, err = await gateway(config, "status")
        doctor_code, doctor_out, _ = await gateway(config, "doctor")
    assert code == 1, out + err
    assert f"schema 0020 (behind {SCHEMA_REVISION}: run gateway migrate)" in line_of(out, "database")
    assert "none running" in line_of(out, "instances")  # what an older schema holds is still read
    assert doctor_code == 1 and "run gateway migrate" in line_of(doctor_out, "✗ database"), doctor_out


# --- doctor -----------------------------------------------------------------------------------


async def test_doctor_checks_the_database_channels_and_jobs_and_passes_when_they_answer(database_url, tmp_path):
    async with FakeLLM(server_kind="vllm", context_window=32_768) as llm, FakeTelegram() as tg, FakeSlack() as slack:
        llm.reply("hi")
        llm.tool_call("get_time", {"timezone": "Europe/Oslo"}, id="t1")
        llm.reply("It is noon.")
        config = write_config(
            tmp_path / "config.yml", database_url, llm.base_url,
            extra=channels_section(tg, slack) + NIGHTLY.format(cron="0 3 * * *"),
        )
        code, out, err = await gateway(config, "doctor", env=channel_env(tg, slack))
    assert code == 0, out + err
    assert "✓ database:" in out
    assert f"@{BOT_USERNAME}" in line_of(out, "✓ telegram:")
    assert "✓ slack:" in out and "✓ slack socket mode" in out
    assert "next firing" in line_of(out, "✓ job nightly")
    assert not [line for line in out.splitlines() if line.startswith("✗")]


FAILURES = {
    # case: (database url or None for SQLite, env changes, config extra, the failing line's start, its words)
    "unreachable database": (
        "postgresql+asyncpg://postgres@127.0.0.1:{port}/gateway", {}, "", "✗ database",
        ("cannot connect", "127.0.0.1:{port}", "GATEWAY_DATABASE_URL", "start PostgreSQL"),
    ),
    "postgresql without +asyncpg": (
        "postgresql://postgres@127.0.0.1:{port}/gateway", {}, "", "✗ database",
        ("postgresql+asyncpg://", "127.0.0.1:{port}/gateway", "GATEWAY_DATABASE_URL"),
    ),
    "database that does not exist": (
        "postgres", {}, "", "✗ database", ("no database", "createdb", "GATEWAY_DATABASE_URL"),
    ),
    "bad telegram token": (
        None, {"TELEGRAM_BOT_TOKEN": "123:wrong"}, "telegram", "✗ telegram:", ("refused", "TELEGRAM_BOT_TOKEN"),
    ),
    "webhook without a secret": (
        None, {}, "webhook", "✗ telegram webhook", ("TELEGRAM_WEBHOOK_SECRET",),
    ),
    "bad slack app token": (
        None, {"SLACK_APP_TOKEN": "xapp-wrong"}, "slack", "✗ slack socket mode", ("SLACK_APP_TOKEN",),
    ),
    "bad cron expression": (
        None, {}, NIGHTLY.format(cron="0 25 * * *"), "✗ job nightly", ("scheduler.jobs[nightly]", "cron"),
    ),
    "base_url without /v1": (None, {}, "root", "✗ reachable", ("HTTP 404", "/v1")),
    "missing key": (None, {}, "keyed", "✗ auth", ("LLM_API_KEY",)),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
async def test_doctor_fails_in_one_line_with_the_fix(case, tmp_path):
    url, env, extra, start, words = FAILURES[case]
    port = closed_port()
    async with FakeLLM(api_key="sk-needed" if extra == "keyed" else None) as llm, FakeTelegram() as tg, \
            FakeSlack() as slack:
        llm_url = llm.base_url.removesuffix("/v1") if extra == "root" else llm.base_url
        if extra == "telegram":
            extra = f"telegram:\n  api_base_url: {tg.base_url}\n"
        elif extra == "webhook":
            extra = f"telegram:\n  api_base_url: {tg.base_url}\n  mode: webhook\n  webhook_url: https://x.example/telegram/webhook\n"
            env = {"TELEGRAM_BOT_TOKEN": tg.token}
        elif extra == "slack":
            extra = f"slack:\n  api_base_url: {slack.base_url}\n"
            env = {"SLACK_BOT_TOKEN": slack.token, **env}
        elif extra in ("root", "keyed"):
            extra = ""
        if url == "postgres":  # a server that answers, without the database named
            if not POSTGRES_URL:
                pytest.skip(NO_POSTGRES)
            url = POSTGRES_URL.rsplit("/", 1)[0] + f"/missing_{port}"
        database = (url or "sqlite:///{tmp}/gateway.db").format(port=port, tmp=tmp_path)
        config = write_config(tmp_path / "config.yml", database, llm_url, extra=extra)
        code, out, err = await gateway(config, "doctor", env=env)
    assert code == 1, out + err
    assert "nothing to change" not in out
    failing = line_of(out, start)
    assert all(word.format(port=port) in failing for word in words), failing
    assert [line for line in out.splitlines() if line.startswith("✗")] == [failing]  # only what is wrong
