"""The embedded default under disk faults: one gateway on SQLite whose disk fills up or goes
read-only while it serves (a small ext4 disk of the test's own, tests/small_disk.py). It stops
acknowledging (Telegram's offset stays where the stored updates end, Slack gets a non-2xx and
delivers again), says so in one line and in /readyz, and carries on by itself when the disk is
back: nothing lost, nothing answered twice, no restart."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fakes.llm import FakeLLM, Reply
from fakes.slack import FakeSlack
from fakes.telegram import FakeTelegram
from helpers import echo, until
from small_disk import SmallDisk
from test_slack_e2e import CHANNEL, slack_config
from test_slack_e2e import running as running_slack
from test_slack_e2e import texts as slack_texts
from test_telegram_e2e import PRIVATE, running, texts, tg_config

from gateway.app import Gateway
from gateway.serving.logs import SaidOnce
from gateway.store import Store

pytestmark = pytest.mark.skipif(bool(SmallDisk.problem()), reason=SmallDisk.problem() or "mounting works")
STORE_LOGGER = "gateway.store.db"


@pytest.fixture
def disk(tmp_path: Path):
    with SmallDisk(tmp_path) as mounted:
        yield mounted


@pytest.fixture
async def disk_store(disk: SmallDisk):
    store = Store(f"sqlite:///{disk.data / 'gateway.db'}")
    await store.migrate()
    try:
        yield store
    finally:
        await store.close()


async def readyz(gateway: Gateway) -> tuple[int, dict[str, Any]]:
    assert gateway.http is not None
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{gateway.http.port}/readyz") as page:
        return page.status, await page.json()


def loud(caplog: pytest.LogCaptureFixture, since: int) -> list[logging.LogRecord]:
    """Warnings and errors logged since the `since`-th record (a traceback is a record with exc_info)."""
    return [r for r in caplog.records[since:] if r.levelno >= logging.WARNING]


def integrity(disk: SmallDisk) -> str:
    with sqlite3.connect(disk.data / "gateway.db") as conn:
        return conn.execute("PRAGMA integrity_check").fetchone()[0]


async def test_a_full_disk_holds_telegrams_offset_says_so_once_and_the_gateway_resumes_when_space_is_back(
    disk, disk_store, llm: FakeLLM, tg: FakeTelegram, tmp_path, caplog
) -> None:
    caplog.set_level(logging.INFO)
    llm.responder = echo
    async with running(disk_store, tg_config(llm, tg, tmp_path), serve_http=True) as gateway:
        tg.private_message(PRIVATE, "before")
        await until(lambda: texts(tg, PRIVATE) == ["re: before"])
        await gateway.inbox.wait_until_idle(10)
        offset = await disk_store.inbox.load_cursor("telegram:offset")
        since = len(caplog.records)

        disk.fill()
        update = tg.private_message(PRIVATE, "while full")
        await until(lambda: disk_store.db.unwritable is not None)
        polls = len(tg.calls_to("getUpdates"))
        await until(lambda: len(tg.calls_to("getUpdates")) >= polls + 2)  # read again, not confirmed
        status, body = await readyz(gateway)
        assert status == 503 and body["ready"] is False and body["database_writable"] is False
        assert "disk is full" in body["database_fault"] and "free space" in body["database_fault"]
        assert tg.pending_updates[0]["update_id"] == update["update_id"]  # Telegram still holds it
        assert int(tg.calls_to("getUpdates")[-1].params.get("offset") or 0) <= update["update_id"]
        said = loud(caplog, since)
        assert len(said) == 1, [r.getMessage() for r in said]
        assert said[0].name == STORE_LOGGER and said[0].exc_info is None
        assert said[0].getMessage().startswith(f"the database's disk is full ({disk.data / 'gateway.db'}): free space")
        assert texts(tg, PRIVATE) == ["re: before"]

        disk.free()
        await until(lambda: texts(tg, PRIVATE) == ["re: before", "re: while full"], 30)
        await gateway.inbox.wait_until_idle(10)
        status, body = await readyz(gateway)
        assert status == 200 and body["database_writable"] is True and "database_fault" not in body
        assert int(await disk_store.inbox.load_cursor("telegram:offset")) > int(offset or 0)
        assert tg.pending_updates == []
        back = [r.getMessage() for r in loud(caplog, since)[1:]]
        assert back == [f"the database takes writes again ({disk.data / 'gateway.db'}): acknowledging messages again"]
    assert len(tg.calls_to("sendMessage")) == 2  # each answered once
    assert integrity(disk) == "ok"


async def test_a_read_only_database_answers_slack_503_says_so_once_and_takes_the_retry_when_writable(
    disk, disk_store, llm: FakeLLM, slack: FakeSlack, tmp_path, caplog
) -> None:
    caplog.set_level(logging.INFO)
    llm.responder = echo
    async with running_slack(disk_store, slack_config(llm, slack, tmp_path), slack) as side:
        await side.mention("before")
        await side.settle(lambda: slack_texts(slack) == ["re: before"])
        since = len(caplog.records)

        disk.read_only(disk.data / "gateway.db")
        ts = side.written(CHANNEL, "U1", "<@UBOT> while read-only")
        event = side.sender.mention(CHANNEL, "U1", "<@UBOT> while read-only", ts=ts)
        refused = await side.sender.event(event, event_id="Ev-readonly")
        assert refused.status == 503  # not 2xx: Slack delivers it again
        again = await side.sender.event(event, event_id="Ev-readonly", retry_num=1)
        assert again.status == 503
        status, body = await readyz(side.gateway)
        assert status == 503 and body["database_writable"] is False
        assert body["database_fault"].startswith(f"the database is read-only ({disk.data / 'gateway.db'}")
        assert "immutable" in body["database_fault"] and "resumes by itself" in body["database_fault"]
        said = loud(caplog, since)
        assert len(said) == 1, [r.getMessage() for r in said]
        assert said[0].name == STORE_LOGGER and said[0].exc_info is None
        assert "read-only" in said[0].getMessage()

        disk.writable()
        taken = await side.sender.event(event, event_id="Ev-readonly", retry_num=2)
        assert taken.status == 200
        await side.settle(lambda: slack_texts(slack) == ["re: before", "re: while read-only"])
        status, body = await readyz(side.gateway)
        assert status == 200 and body["database_writable"] is True
    posts = [c for c in slack.calls if c.method in ("chat.postMessage", "chat.startStream")]
    assert len(posts) == 2  # each answered once
    assert integrity(disk) == "ok"


async def test_a_turn_under_way_when_the_disk_fills_is_answered_once_when_it_is_back_and_the_log_says_it_once(
    disk, disk_store, llm: FakeLLM, tg: FakeTelegram, tmp_path, caplog
) -> None:
    caplog.set_level(logging.INFO)
    caplog.handler.addFilter(SaidOnce())  # as `gateway serve` logs (gateway/serving/logs.py)
    asked, answer = asyncio.Event(), asyncio.Event()

    async def held_once(request: dict[str, Any]) -> Reply:
        if not asked.is_set():
            asked.set()
            await answer.wait()  # the disk fills while the model is thinking
        return echo(request)

    llm.responder = held_once
    async with running(disk_store, tg_config(llm, tg, tmp_path), serve_http=True) as gateway:
        since = len(caplog.records)
        tg.private_message(PRIVATE, "question")
        await asyncio.wait_for(asked.wait(), 10)
        disk.fill()
        answer.set()  # the turn's next write (its round) meets the full disk
        await until(lambda: disk_store.db.unwritable is not None)
        tg.private_message(PRIVATE, "meanwhile")
        polls = len(tg.calls_to("getUpdates"))
        await until(lambda: len(tg.calls_to("getUpdates")) >= polls + 2 or not gateway.channels_started()["telegram"])
        said = loud(caplog, since)
        assert [r.getMessage()[:28] for r in said] == ["the database's disk is full "], [r.getMessage() for r in said]

        disk.free()
        # The crashed run is done again, the message that came meanwhile drained into it.
        await until(lambda: "meanwhile" in "".join(texts(tg, PRIVATE)), 30)
        await gateway.inbox.wait_until_idle(10)
        assert texts(tg, PRIVATE) == ["re: question\n\nmeanwhile"]
        status, _ = await readyz(gateway)
        assert status == 200
    assert len(tg.calls_to("sendMessage")) == 1  # answered once
    lines = [r.getMessage() for r in loud(caplog, since)]
    assert len(lines) == 2 and lines[0].startswith("the database's disk is full "), lines
    assert lines[1].startswith("the database takes writes again ")
    assert integrity(disk) == "ok"
