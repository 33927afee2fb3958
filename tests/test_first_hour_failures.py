"""The first hour's failures, through the real command line (a subprocess each): every failure
an operator can cause is ONE line on stderr that names the setting (and its environment
variable) and what to do, with its own exit code; `--debug` (or logging.level: debug) shows the
traceback; a reader that leaves ends a command quietly. Paths are relative to the configuration
file, whatever the current directory, and a command says which database it opened when it is
not the default one. And the small things: --version, a description for every subcommand, "did
you mean", YAML errors with file and line, duplicate keys refused, `migrate` saying "created",
upgrade notes only for an install from before, and `make install` saying what it does."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import NO_POSTGRES, POSTGRES_URL
from test_chat_cli import REPO, child_env
from test_serve import free_port, wait_for_http

from gateway.cli.toplevel import EXIT_CODES, subcommands
from gateway.store import AuditEntry, Store

WAIT_S = 60


@dataclass
class Ran:
    code: int
    out: str
    err: str

    def one_line(self) -> str:
        """The failure's one line: nothing else on stderr, no traceback, nothing on stdout."""
        lines = self.err.splitlines()
        assert len(lines) == 1, self.err
        assert self.out == "", self.out
        assert lines[0].startswith("gateway: "), lines[0]
        return lines[0]


async def gateway(*args: str, cwd: Path, env: dict[str, str] | None = None) -> Ran:
    """`python -m gateway <args>` in `cwd`, without blocking the fakes in this event loop."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", *args, cwd=str(cwd), env={**child_env(), **(env or {})},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), WAIT_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return Ran(process.returncode, out.decode(), err.decode())


def write(directory: Path, text: str = "", *, llm_url: str = "http://127.0.0.1:9/v1") -> Path:
    """A configuration in `directory` (no database key: the default one beside it)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "config.yml"
    path.write_text(
        f"llm:\n  base_url: {llm_url}\n  model: test-model\n  max_retries: 1\n"
        f"scheduler:\n  enabled: false\nhttp:\n  port: {free_port()}\nserve:\n  shutdown_grace: 2s\n{text}"
    )
    return path


def with_database(url: str) -> dict[str, str]:
    return {"GATEWAY_DATABASE_URL": url}


# ---- the database --------------------------------------------------------------------------------


async def test_an_unreachable_postgresql_is_one_line(tmp_path):
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/gateway"
    ran = await gateway("runs", "list", "--config", str(write(tmp_path)), cwd=tmp_path, env=with_database(url))
    line = ran.one_line()
    assert "cannot connect to PostgreSQL at 127.0.0.1" in line and "connection refused" in line
    assert "database.url (GATEWAY_DATABASE_URL)" in line and "start PostgreSQL there" in line
    assert ran.code == EXIT_CODES["database_unreachable"]


async def test_an_unknown_database_host_is_one_line(tmp_path):
    url = "postgresql+asyncpg://postgres@no-such-host.invalid:5432/gateway"
    ran = await gateway("runs", "list", "--config", str(write(tmp_path)), cwd=tmp_path, env=with_database(url))
    line = ran.one_line()
    assert "no such host" in line and "correct the host in database.url (GATEWAY_DATABASE_URL)" in line
    assert ran.code == EXIT_CODES["database_unreachable"]


@pytest.mark.skipif(not POSTGRES_URL, reason=NO_POSTGRES)
async def test_a_missing_database_is_one_line(tmp_path):
    url = POSTGRES_URL.rsplit("/", 1)[0] + "/gateway_no_such_database"
    ran = await gateway("runs", "list", "--config", str(write(tmp_path)), cwd=tmp_path, env=with_database(url))
    line = ran.one_line()
    assert "has no database 'gateway_no_such_database'" in line and "createdb" in line
    assert "database.url (GATEWAY_DATABASE_URL)" in line
    assert ran.code == EXIT_CODES["database_missing"]


@pytest.mark.skipif(not POSTGRES_URL, reason=NO_POSTGRES)
async def test_a_refused_database_login_is_one_line(tmp_path):
    url = re.sub(r"://[^@/]*@", "://no_such_role:secret-pw@", POSTGRES_URL)
    ran = await gateway("runs", "list", "--config", str(write(tmp_path)), cwd=tmp_path, env=with_database(url))
    line = ran.one_line()
    assert "refused the login" in line and "no_such_role" in line and "secret-pw" not in line
    assert "correct the user and password in database.url (GATEWAY_DATABASE_URL)" in line
    assert ran.code == EXIT_CODES["database_login"]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("postgresql://postgres:pw@127.0.0.1:5432/gateway", "write postgresql+asyncpg:// instead"),
        ("mysql://root:pw@127.0.0.1/gateway", "mysql is not supported"),
        ("garbage", "'garbage', which is not a database URL"),
    ],
    ids=["postgresql-without-asyncpg", "mysql", "garbage"],
)
async def test_a_database_url_the_gateway_cannot_use_is_one_line(tmp_path, url, says):
    ran = await gateway("runs", "list", "--config", str(write(tmp_path)), cwd=tmp_path, env=with_database(url))
    line = ran.one_line()
    assert says in line and "database.url (GATEWAY_DATABASE_URL)" in line and ":pw@" not in line
    assert "postgresql+asyncpg://" in line  # what to write
    assert ran.code == EXIT_CODES["database_url"]


async def test_postgresql_without_its_driver_installed_is_one_line(tmp_path):
    shadow = tmp_path / "shadow" / "asyncpg"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'asyncpg'\", name='asyncpg')\n")
    env = {**with_database("postgresql+asyncpg://postgres@127.0.0.1:5432/gateway"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "shadow"), str(REPO)])}
    ran = await gateway("runs", "list", "--config", str(write(tmp_path)), cwd=tmp_path, env=env)
    line = ran.one_line()
    assert "asyncpg is not installed" in line and "chat-gateway[postgres]" in line and "database.url" in line
    assert ran.code == EXIT_CODES["database_url"]


async def test_a_sqlite_file_that_cannot_be_created_is_one_line(tmp_path):
    (tmp_path / "taken").write_text("a file where the database's directory would go")
    config = write(tmp_path, "database:\n  url: sqlite+aiosqlite:///taken/gateway.db\n")
    ran = await gateway("runs", "list", "--config", str(config), cwd=tmp_path)
    line = ran.one_line()
    assert f"cannot open the SQLite database {tmp_path}/taken/gateway.db" in line and "database.url" in line
    assert ran.code == EXIT_CODES["database_unreachable"]


async def test_an_old_schema_without_auto_migrate_is_one_line(tmp_path):
    config = write(tmp_path, "database:\n  auto_migrate: false\n")
    ran = await gateway("runs", "list", "--config", str(config), cwd=tmp_path)
    line = ran.one_line()
    assert "database.auto_migrate is false" in line and "run `gateway migrate` first" in line
    assert ran.code == EXIT_CODES["database_schema"]


async def test_a_schema_newer_than_this_gateway_is_one_line(tmp_path):
    config = write(tmp_path)
    assert (await gateway("migrate", "--config", str(config), cwd=tmp_path)).code == 0
    with sqlite3.connect(tmp_path / "data" / "gateway.db") as db:
        db.execute("UPDATE alembic_version SET version_num = '9999'")
    ran = await gateway("runs", "list", "--config", str(config), cwd=tmp_path)
    line = ran.one_line()
    assert "is at schema 9999, newer than this gateway's" in line and "database.url" in line
    assert ran.code == EXIT_CODES["database_schema"]


# ---- serve: the port, the channels, the workspace ---------------------------------------------------


async def serve(config: Path, *, cwd: Path, env: dict[str, str] | None = None, level: str = "error") -> Ran:
    """A `gateway serve` that fails to start (at `level`, the start log's lines stay out of it)."""
    return await gateway("serve", "--config", str(config), "--log-level", level, cwd=cwd, env=env)


async def test_a_port_in_use_names_http_port_and_where_to_change_it(tmp_path, llm):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write(tmp_path, llm_url=llm.base_url)
        config.write_text(re.sub(r"port: \d+", f"port: {port}", config.read_text()))
        ran = await serve(config, cwd=tmp_path)
    line = ran.one_line()
    assert f"http.port: 127.0.0.1:{port} is already in use" in line
    assert f"set http.port in {config} to a free port" in line
    assert ran.code == EXIT_CODES["http_bind"]


async def test_a_bad_telegram_token_is_one_line(tmp_path, llm, tg):
    config = write(tmp_path, f"telegram:\n  api_base_url: {tg.base_url}\n", llm_url=llm.base_url)
    ran = await serve(config, cwd=tmp_path, env={"TELEGRAM_BOT_TOKEN": "999:wrong-token"})
    line = ran.one_line()
    assert "telegram.token (TELEGRAM_BOT_TOKEN): the bot token was rejected" in line and "@BotFather" in line
    assert "wrong-token" not in line
    assert ran.code == EXIT_CODES["token_rejected"]


async def test_an_unreachable_bot_api_is_one_line(tmp_path, llm):
    api = f"http://127.0.0.1:{free_port()}/bot"
    config = write(tmp_path, f"telegram:\n  api_base_url: {api}\n", llm_url=llm.base_url)
    ran = await serve(config, cwd=tmp_path, env={"TELEGRAM_BOT_TOKEN": "123:secret-token"})
    line = ran.one_line()
    assert f"telegram: cannot reach the Bot API at {api}" in line and "telegram.api_base_url" in line
    assert "secret-token" not in line
    assert ran.code == EXIT_CODES["platform_unreachable"]


async def test_webhook_mode_without_a_secret_is_one_line(tmp_path, llm, tg):
    config = write(
        tmp_path,
        f"telegram:\n  api_base_url: {tg.base_url}\n  mode: webhook\n"
        "  webhook_url: https://gw.example/telegram/webhook\n",
        llm_url=llm.base_url,
    )
    ran = await serve(config, cwd=tmp_path, env={"TELEGRAM_BOT_TOKEN": tg.token})
    line = ran.one_line()
    assert "telegram.webhook_secret (TELEGRAM_WEBHOOK_SECRET) is not set" in line
    assert "set TELEGRAM_WEBHOOK_SECRET to a random string" in line and "telegram.mode: polling" in line
    assert ran.code == EXIT_CODES["channel_settings"]
    assert tg.calls_to("setWebhook") == []


async def test_a_bad_slack_token_is_one_line(tmp_path, llm, slack):
    config = write(tmp_path, f"slack:\n  api_base_url: {slack.base_url}\n", llm_url=llm.base_url)
    env = {"SLACK_BOT_TOKEN": "xoxb-wrong", "SLACK_APP_TOKEN": slack.app_token}
    ran = await serve(config, cwd=tmp_path, env=env)
    line = ran.one_line()
    assert "slack.bot_token (SLACK_BOT_TOKEN): Slack refused the token (invalid_auth)" in line
    assert "set SLACK_BOT_TOKEN to the xoxb- bot token" in line
    assert ran.code == EXIT_CODES["token_rejected"]


async def test_a_bad_slack_app_token_is_one_line(tmp_path, llm, slack):
    config = write(tmp_path, f"slack:\n  api_base_url: {slack.base_url}\n", llm_url=llm.base_url)
    env = {"SLACK_BOT_TOKEN": slack.token, "SLACK_APP_TOKEN": "xapp-wrong"}
    ran = await serve(config, cwd=tmp_path, env=env)
    line = ran.one_line()
    assert "slack.app_token (SLACK_APP_TOKEN): Slack refused the token" in line and "xapp-" in line
    assert ran.code == EXIT_CODES["token_rejected"]


async def test_a_workspace_that_cannot_be_created_is_one_line(tmp_path, llm):
    (tmp_path / "files").write_text("a file where the workspace would go")
    config = write(tmp_path, "agent:\n  workspace: files/workspace\n", llm_url=llm.base_url)
    ran = await serve(config, cwd=tmp_path)
    line = ran.one_line()
    assert f"agent.workspace: cannot create {tmp_path}/files/workspace" in line
    assert f"set agent.workspace in {config}" in line
    assert ran.code == EXIT_CODES["path"]


async def test_at_the_default_log_level_the_failure_is_said_once_without_a_traceback(tmp_path, llm, tg):
    config = write(tmp_path, f"telegram:\n  api_base_url: {tg.base_url}\n", llm_url=llm.base_url)
    ran = await serve(config, cwd=tmp_path, env={"TELEGRAM_BOT_TOKEN": "999:wrong-token"}, level="info")
    assert ran.code == EXIT_CODES["token_rejected"]
    assert ran.err.count("the bot token was rejected") == 1, ran.err
    assert "Traceback" not in ran.err and "failed to start" not in ran.err
    others = [line for line in ran.err.splitlines() if not re.match(r"^\S+ \S+ (INFO|WARNING) [\w.]+: ", line)]
    assert others == [ran.err.splitlines()[-1]] and others[0].startswith("gateway: telegram.token")


# ---- --debug and logging.level: debug show the traceback --------------------------------------------


async def test_debug_shows_the_traceback_above_the_one_line(tmp_path):
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/gateway"
    config = str(write(tmp_path))
    for args in (["--debug", "runs", "list", "--config", config], ["runs", "list", "--config", config, "--debug"]):
        ran = await gateway(*args, cwd=tmp_path, env=with_database(url))
        assert ran.code == EXIT_CODES["database_unreachable"]
        assert "Traceback (most recent call last)" in ran.err and "ConnectionRefusedError" in ran.err
        assert ran.err.splitlines()[-1].startswith("gateway: cannot connect to PostgreSQL")
        assert ran.err.count("gateway: cannot connect") == 1


async def test_logging_level_debug_shows_the_traceback_too(tmp_path):
    config = write(tmp_path, "logging:\n  level: debug\n")
    url = f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/gateway"
    ran = await gateway("runs", "list", "--config", str(config), cwd=tmp_path, env=with_database(url))
    assert ran.code == EXIT_CODES["database_unreachable"]
    assert "Traceback (most recent call last)" in ran.err
    assert ran.err.splitlines()[-1].startswith("gateway: cannot connect to PostgreSQL")


# ---- configuration errors ---------------------------------------------------------------------------


async def test_a_yaml_error_names_the_file_and_line(tmp_path):
    config = write(tmp_path, "agent:\n  max_rounds: 3\n   tools: [\n")
    ran = await gateway("runs", "list", "--config", str(config), cwd=tmp_path)
    line = ran.one_line()
    lines = config.read_text().splitlines()
    assert line.startswith(f"gateway: {config}: line {len(lines)}, column ") and "not valid YAML" in line
    assert "<unicode string>" not in line
    assert ran.code == EXIT_CODES["config"]


async def test_a_key_written_twice_is_refused_with_both_lines(tmp_path):
    config = write(tmp_path, "agent:\n  max_rounds: 3\n  max_rounds: 30\n")
    ran = await gateway("runs", "list", "--config", str(config), cwd=tmp_path)
    line = ran.one_line()
    second = len(config.read_text().splitlines())
    assert line == f"gateway: {config}: line {second}: max_rounds is written twice in this mapping " \
                   f"(first on line {second - 1}): keep one"
    assert ran.code == EXIT_CODES["config"]


async def test_an_unknown_key_gets_a_did_you_mean(tmp_path):
    config = write(tmp_path, "agent:\n  max_round: 3\n")
    ran = await gateway("runs", "list", "--config", str(config), cwd=tmp_path)
    assert ran.one_line() == f"gateway: {config}: agent.max_round: unknown key; did you mean max_rounds?"
    assert ran.code == EXIT_CODES["config"]


# ---- a reader that leaves -----------------------------------------------------------------------------


async def test_a_reader_that_leaves_ends_the_command_quietly(tmp_path):
    config = write(tmp_path)
    store = Store(f"sqlite+aiosqlite:///{tmp_path / 'data' / 'gateway.db'}")
    await store.migrate()
    # Far more than a pipe holds: the command is still writing when `head` has left.
    await store.audit.record(*[AuditEntry(kind="console_action", action="login", actor=f"p{i}") for i in range(3000)])
    await store.close()
    command = f"set -o pipefail; '{sys.executable}' -m gateway audit --limit 3000 --config '{config}' | head -n 1"
    process = await asyncio.create_subprocess_exec(
        "bash", "-c", command, cwd=str(tmp_path), env=child_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), WAIT_S)
    assert err.decode() == ""  # no BrokenPipeError, no "Exception ignored"
    assert len(out.decode().splitlines()) == 1
    assert process.returncode == 141  # as a shell reports a program its reader left


# ---- paths relative to the configuration file ------------------------------------------------------


async def test_a_command_run_from_another_directory_opens_the_configs_database(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    write(run)
    elsewhere.mkdir()
    store = Store(f"sqlite+aiosqlite:///{run / 'data' / 'gateway.db'}")
    await store.migrate()
    await store.audit.record(AuditEntry(kind="console_action", action="login", actor="the-owner"))
    await store.close()
    from_run = await gateway("audit", "--config", "config.yml", cwd=run)
    from_elsewhere = await gateway("audit", cwd=elsewhere, env={"GATEWAY_CONFIG": "../run/config.yml"})
    assert from_run.code == from_elsewhere.code == 0
    assert "the-owner" in from_run.out and from_elsewhere.out == from_run.out
    assert from_elsewhere.err == ""  # the default database: nothing to say
    assert not (elsewhere / "data").exists()


async def test_a_database_that_is_not_the_default_is_named(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    config = write(run, "database:\n  url: sqlite+aiosqlite:///state/other.db\n")
    elsewhere.mkdir()
    first = await gateway("audit", "--config", str(config), cwd=elsewhere)
    again = await gateway("audit", "--config", str(config), cwd=elsewhere)
    assert first.err == f"created a new database at {run}/state/other.db\n"
    assert again.err == f"using the database at {run}/state/other.db (database.url)\n"
    assert (run / "state" / "other.db").is_file() and not (elsewhere / "state").exists()


async def serve_until_ready(config: Path, *, cwd: Path, env: dict[str, str]) -> str:
    """A `gateway serve` from start to a clean stop; its log."""
    port = int(re.search(r"port: (\d+)", config.read_text()).group(1))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", cwd=str(cwd), env={**child_env(), **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert (await wait_for_http(f"http://127.0.0.1:{port}/readyz")).status == 200
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), WAIT_S) == 0
        return (await process.stdout.read()).decode()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


UPGRADE_NOTES = ("no longer by the person who asked", "new default", "for the old behaviour")


async def test_serve_from_elsewhere_uses_the_configs_paths_and_speaks_of_upgrades_only_on_an_old_database(
    tmp_path, llm, tg
):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    config = write(run, f"telegram:\n  api_base_url: {tg.base_url}\n", llm_url=llm.base_url)
    elsewhere.mkdir()
    env = {"GATEWAY_CONFIG": str(config), "TELEGRAM_BOT_TOKEN": tg.token}
    first = await serve_until_ready(config, cwd=elsewhere, env=env)
    assert f"created a new database at {run}/data/gateway.db" in first
    assert (run / "workspace" / "sessions").is_dir() and (run / "data" / "gateway.db").is_file()
    assert list(elsewhere.iterdir()) == []
    assert not [note for note in UPGRADE_NOTES if note in first], first
    assert "telegram has no admin" in first  # who decides is still said, without the history
    second = await serve_until_ready(config, cwd=elsewhere, env=env)
    assert "created a new database" not in second
    assert all(note in second for note in UPGRADE_NOTES), second


# ---- the small things ---------------------------------------------------------------------------------


async def test_version(tmp_path):
    ran = await gateway("--version", cwd=tmp_path)
    assert ran.code == 0 and re.fullmatch(r"gateway \d+\.\d+\.\d+\S*\n", ran.out), ran.out


async def test_every_subcommand_has_a_description(tmp_path):
    from gateway.__main__ import build_parser

    found = list(subcommands(build_parser()))
    assert len(found) > 20
    assert [name for name, parser, _ in found if not parser.description] == []
    ran = await gateway("runs", "show", "--help", cwd=tmp_path)
    assert ran.code == 0 and "One run: its events, tool calls and sub-agents." in ran.out


async def test_migrate_says_created_on_a_new_database_then_up_to_date(tmp_path):
    config = write(tmp_path)
    created = await gateway("migrate", "--config", str(config), cwd=tmp_path)
    again = await gateway("migrate", "--config", str(config), cwd=tmp_path)
    assert created.code == again.code == 0
    assert created.out.startswith(f"created the database at {tmp_path}/data/gateway.db (schema ")
    assert again.out.startswith(f"the database at {tmp_path}/data/gateway.db is up to date (schema ")


def test_exit_codes_are_distinct_and_documented():
    assert len(set(EXIT_CODES.values())) == len(EXIT_CODES)
    operations = (REPO / "docs" / "operations.md").read_text()
    for code in EXIT_CODES.values():
        assert re.search(rf"^\| `{code}` \|", operations, re.M), f"exit code {code} is not in docs/operations.md"


def test_the_first_install_says_what_it_does_and_how_long(tmp_path):
    """A dry run of `make install` into a new virtualenv: a line says what happens and how long it
    takes before pip runs (which stays quiet)."""
    plan = subprocess.run(
        ["make", "-n", f"VENV={tmp_path / 'venv'}", "install"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert plan.returncode == 0, plan.stderr
    lines = plan.stdout.splitlines()
    first_pip = next(i for i, line in enumerate(lines) if "pip install" in line)
    said = [line for line in lines[:first_pip] if line.startswith("echo")]
    assert said and re.search(r"minute", said[-1]) and "install" in said[-1], lines
