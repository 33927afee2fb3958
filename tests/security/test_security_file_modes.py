"""Item 8: the gateway's files are its user's alone.

The attack: another account on the machine reads the database (every conversation, stored
tokens), its WAL, the session directories, attachments people sent and files the tools wrote.
After a real start (`gateway serve`, a message with a file, a `write_file` call) nothing the
gateway created is readable, writable or listable by the group or others; an install from
before, whose files were created 0644/0755, is fixed when the database is opened.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sqlite3
import stat
import sys
from pathlib import Path

import yaml
from fakes.llm import FakeLLM
from fakes.telegram import FakeTelegram
from harness import make_config, running_gateway
from helpers import until
from test_attachments_restart import settings
from test_chat_cli import REPO, child_env
from test_serve import free_port
from test_telegram_e2e import PRIVATE, texts

from gateway.store import Store


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def open_to_others(*roots: Path) -> dict[str, str]:
    """Every file and directory under the roots (the roots included) that the group or others
    may read, write or enter, with its mode."""
    found = {}
    for root in roots:
        for path in [root, *root.rglob("*")]:
            if mode(path) & 0o077:
                found[str(path)] = oct(mode(path))
    return found


async def test_after_a_real_start_nothing_the_gateway_made_is_open_to_other_users(
    llm: FakeLLM, tg: FakeTelegram, tmp_path
):
    data, workspace = tmp_path / "data", tmp_path / "ws"
    values = settings(llm, tg, tmp_path, f"sqlite+aiosqlite:///{data / 'gateway.db'}", free_port())
    values["approvals"] = {"self_approve": True, "rules": [{"tool": "write_file", "action": "allow"}]}
    values["telegram"] = {**values["telegram"], "token": "${TELEGRAM_BOT_TOKEN}"}  # secrets: env only
    config_path = tmp_path / "config.yml"
    config_path.write_text(yaml.safe_dump(values))
    llm.tool_call("write_file", {"path": "notes/summary.txt", "content": "what was said"}, id="w1")
    llm.reply("Written.")
    document = tg.files.document(b"the minutes of Tuesday\n", "minutes.txt", "text/plain")
    tg.enqueue(tg.message_update(PRIVATE, "summarise", user_id=PRIVATE, media={"document": document}))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config_path),
        cwd=str(REPO), env={**child_env(), "TELEGRAM_BOT_TOKEN": tg.token},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    try:
        await until(lambda: "Written." in texts(tg, PRIVATE) or process.returncode is not None, timeout=60)
        assert process.returncode is None, "gateway serve exited"
        made = {
            "data dir": data,
            "database": data / "gateway.db",
            "WAL": data / "gateway.db-wal",
            "workspace": workspace,
            "sessions": workspace / "sessions",
            "write_file's file": next(workspace.rglob("summary.txt")),
            "attachment": next(workspace.rglob("minutes.txt")),
        }
        assert {name: oct(mode(path)) for name, path in made.items() if mode(path) & 0o077} == {}
        assert open_to_others(data, workspace) == {}  # the SHM, the directories on the way, ...
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 30)


async def test_an_install_from_before_is_made_private_when_its_database_is_opened(tmp_path, caplog):
    """`data/` 0755 and the database 0644 (what earlier versions left under umask 022): the open
    tightens them and says so once; the next open has nothing to say."""
    data = tmp_path / "data"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    database = data / "gateway.db"
    with sqlite3.connect(database) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE kept (x)")
    os.chmod(database, 0o644)
    caplog.set_level(logging.INFO)
    for _ in range(2):
        store = Store(f"sqlite+aiosqlite:///{database}")
        await store.migrate(auto=True)
        await store.close()
    assert (oct(mode(data)), oct(mode(database))) == ("0o700", "0o600")
    said = [r.getMessage() for r in caplog.records if str(database) in r.getMessage()]
    assert len(said) == 1 and "other users" in said[0], said


async def test_session_directories_of_before_are_closed_at_start(sqlite_store, tmp_path):
    """A workspace whose `sessions/` an earlier version made 0755: the start closes it, so no
    session's files (attachments, what the tools wrote) can be reached by another account."""
    sessions = tmp_path / "ws" / "sessions"
    (sessions / "1").mkdir(parents=True)
    os.chmod(sessions, 0o755)
    async with FakeLLM() as llm:
        async with running_gateway(sqlite_store, make_config(llm.base_url, str(tmp_path / "ws"))):
            pass
    assert oct(mode(sessions)) == "0o700"
