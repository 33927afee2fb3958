"""A `kill -9` between storing a message and downloading its file: after the restart the file is
still fetched and the turn runs once. `gateway serve` runs as a real process, on SQLite and
PostgreSQL; the restarted gateway runs in the test process against the same database."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from fakes.llm import FakeLLM
from fakes.telegram import BOT_ID, FakeTelegram
from harness import make_config
from media import text_of, user_message
from test_chat_cli import REPO, child_env
from test_serve import free_port
from test_telegram_e2e import PRIVATE, UNPACED, running, settle, texts

from gateway.store import Store


def settings(llm: FakeLLM, tg: FakeTelegram, tmp_path: Path, database_url: str, port: int) -> dict:
    return {
        "database": {"url": database_url},
        "llm": {"base_url": llm.base_url, "model": "test-model", "max_retries": 1, "retry_budget_s": 5},
        "agent": {"workspace": str(tmp_path / "ws"), "system_prompt": "You are a test agent."},
        "inbox": {"poll_interval_s": 0.05, "lease_ttl_s": 2},
        "scheduler": {"enabled": False},
        "serve": {"shutdown_grace": 2},
        "http": {"port": port},
        "attachments": {"download_backoff_s": 0.01},
        "access": {"dm_policy": "open", "group_policy": "open"},
        "telegram": {
            "token": tg.token,
            "api_base_url": tg.base_url,
            "api_file_url": f"{tg.url}/file/bot",
            "poll_timeout_s": 1,
            "edit_interval_s": 0,
            **UNPACED,
        },
    }


async def test_a_kill_between_commit_and_download_still_fetches_the_file_and_runs_once(
    llm, tg, tmp_path, database_url
) -> None:
    import yaml

    values = settings(llm, tg, tmp_path, database_url, free_port())
    config_path = tmp_path / "config.yml"
    on_disk = {**values, "telegram": {**values["telegram"], "token": "${TELEGRAM_BOT_TOKEN}"}}  # secrets: env only
    config_path.write_text(yaml.safe_dump(on_disk))
    document = tg.files.document(b"the minutes of Tuesday\n", "minutes.txt", "text/plain")
    update = tg.enqueue(tg.message_update(PRIVATE, "summarise", user_id=PRIVATE, media={"document": document}))
    tg.files.hold_downloads()  # the first process gets as far as asking for the file
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(config_path),
        cwd=str(REPO),
        env={**child_env(), "TELEGRAM_BOT_TOKEN": tg.token},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        started = asyncio.create_task(tg.files.download_started.wait())
        exited = asyncio.create_task(process.wait())
        await asyncio.wait({started, exited}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        started.cancel()
        if process.returncode is None:
            process.kill()  # SIGKILL: no shutdown, no cleanup
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    output = (await process.stdout.read()).decode() if process.stdout else ""
    assert tg.files.download_started.is_set(), output

    store = Store(database_url)
    try:
        item = await store.inbox.get_by_event(f"tg:{BOT_ID}:{update['update_id']}")
        assert item is not None, output  # committed before the download began
        assert item.status == "pending" and "outcome" not in item.payload["attachments"][0]
        assert llm.requests == [] and texts(tg, PRIVATE) == []
        tg.files.release_downloads()
        llm.reply("Tuesday's minutes, summarised.")
        config = make_config(
            llm.base_url, values["agent"]["workspace"], **{k: v for k, v in values.items() if k != "llm"}
        )
        async with running(store, config) as gateway:
            await settle(gateway, lambda: texts(tg, PRIVATE))
        assert texts(tg, PRIVATE) == ["Tuesday's minutes, summarised."]
        assert len(llm.requests) == 1
        assert "Content:\n<<<\nthe minutes of Tuesday\n\n>>>" in text_of(user_message(llm.requests[0]))
        stored = tmp_path / "ws" / "sessions" / "1" / "attachments" / "1" / "minutes.txt"
        assert stored.read_text() == "the minutes of Tuesday\n"
        done = await store.inbox.get_by_event(f"tg:{BOT_ID}:{update['update_id']}")
        assert done.status == "done" and done.payload["attachments"][0]["outcome"]["status"] == "saved"
        assert tg.files.download_attempts == [document["file_id"]] * 2  # one per process
    finally:
        await store.close()
