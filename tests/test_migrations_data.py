"""Upgrades keep what a gateway holds: each released schema revision's database (its rows in
tests/fixtures/migrations/, see tests/migration_fixtures.py) migrates to head with the project's
own migrate, on SQLite and PostgreSQL, and every row is still there and still works through
today's code; a downgrade to the released revision and back up keeps it too."""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from conftest import NO_POSTGRES, POSTGRES_URL, on_postgres
from fakes.channel import FakeChannel
from harness import make_config, running_gateway
from helpers import ManualClock, session_file
from migration_fixtures import (
    FIXTURES,
    OWNER,
    PARKED_TOKEN,
    REVISIONS,
    TG_THREAD,
    at,
    build,
    columns_at,
    downgrade_to,
    load,
    migrate_to,
    rows_at,
)
from sqlalchemy import select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from gateway.approvals.prompts import PromptService, button_token
from gateway.config import Config, SchedulerConfig
from gateway.events import ButtonPress, Delivered, Sender, ThreadKey
from gateway.store import Action, Saved, Store
from gateway.store.db import SCHEMA_REVISION, MigrationBrokeReferences, current_revision
from gateway.store.tables import metadata
from scheduler.jobs import Scheduler

ADA = Sender("42", "Ada", "ada")


@pytest.fixture
async def empty_store(db_kind: str, tmp_path) -> AsyncIterator[Store]:
    """A database of its own with no schema at all (a fixture is loaded into it)."""
    if db_kind == "sqlite":
        store = Store(f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}")
        try:
            yield store
        finally:
            await store.close()
        return
    if not POSTGRES_URL:
        pytest.skip(NO_POSTGRES)
    schema = f"t_{uuid.uuid4().hex[:12]}"
    await on_postgres(f'CREATE SCHEMA "{schema}"')
    store = Store(POSTGRES_URL, pg_schema=schema)
    try:
        yield store
    finally:
        await store.close()
        await on_postgres(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.mark.parametrize("revision", REVISIONS)
async def test_the_fixture_files_are_current(revision):
    # Rebuild with: .venv/bin/python tests/migration_fixtures.py
    assert (FIXTURES / f"{revision}.sql").read_text() == await build(revision)


@pytest.mark.parametrize("revision", REVISIONS)
async def test_a_released_database_upgrades_with_its_data(empty_store, revision):
    expected = await loaded(empty_store, revision)
    assert await empty_store.migrate() == revision  # the migrate a start runs
    assert await current_revision(empty_store.db) == SCHEMA_REVISION
    await still_there(empty_store, expected)
    await still_works(empty_store, expected)


@pytest.mark.parametrize("revision", REVISIONS)
async def test_a_downgrade_to_a_released_revision_and_back_keeps_its_data(empty_store, revision):
    expected = await loaded(empty_store, revision)
    await empty_store.migrate()
    await downgrade_to(empty_store, revision)
    assert await current_revision(empty_store.db) == revision
    assert await empty_store.db.read(columns_at) == await columns_of_a_fresh(revision, empty_store)
    assert await empty_store.migrate() == revision
    await still_there(empty_store, expected)
    await still_works(empty_store, expected)


@pytest.mark.parametrize("revision", REVISIONS)
async def test_a_turn_parked_before_the_upgrade_is_approved_by_a_tap_after_it(empty_store, llm, tmp_path, revision):
    """The gateway of the new version starts on the old database (its start migrates it), the
    requester taps Approve on the prompt sent before the upgrade: the tool runs and the parked turn
    gets its reply, with the message typed while it waited."""
    await loaded(empty_store, revision)
    llm.reply("Written.")
    workspace = tmp_path / "ws"
    channel = FakeChannel(name="telegram")
    thread = ThreadKey.parse(TG_THREAD)
    config = make_config(llm.base_url, str(workspace))
    # the gateway's clock an hour after the fixture's last write: the approval has not expired
    async with running_gateway(empty_store, config, channel, clock=ManualClock(at(1))) as h:
        assert await current_revision(empty_store.db) == SCHEMA_REVISION
        answer = await h.tap(button_token(PARKED_TOKEN, Action.APPROVE), thread=thread, sender=ADA)
        assert not answer.alert and "Approved by Ada" in answer.answer
        await h.wait_for(lambda: "Written." in channel.messages(thread))
        await h.idle()
        assert session_file(workspace, "note.txt").read_text() == "hi"
        assert channel.closes() == ["✅ Approved by Ada"]
        parked = await empty_store.runs.get(1)
        assert parked is not None and (parked.stage, parked.end_reason) == ("SUCCESS", "reply")
        # the model read the turn from before the upgrade, the tool's result and the held message
        asked = json.dumps(llm.requests[-1]["messages"])
        assert "note.txt" in asked and "and tell me when done" in asked
        assert await empty_store.inbox.pending(TG_THREAD) == []
        # what was sent, or given up on, before the upgrade is not sent again
        assert not {"Two alerts, both resolved.", "Sorry, that failed."} & set(channel.messages())


async def test_a_sqlite_migration_that_breaks_references_is_rolled_back(sqlite_store):
    """Migrations run with SQLite's foreign keys off (a rebuilt table's DROP would cascade), so
    the references are checked before the commit: a step leaving a message without its session
    fails in one line and leaves nothing behind."""

    def orphan(conn: Connection) -> None:
        conn.exec_driver_sql(
            "INSERT INTO messages (session_id, seq, role, content, status, synthetic, created_at) "
            "VALUES (999, 1, 'user', 'orphan', 'ok', 0, '2026-12-01 12:00:00.000000')"
        )

    with pytest.raises(MigrationBrokeReferences, match="1 rows referring to missing rows"):
        await sqlite_store.db.migrate(orphan)
    count = await sqlite_store.db.read(lambda conn: conn.exec_driver_sql("SELECT count(*) FROM messages").scalar())
    assert count == 0
    # and the store's own connections still enforce them
    with pytest.raises(IntegrityError):
        await sqlite_store.db.write(orphan)


# ---- the fixture, and what it must still be ----------------------------------------------------
async def loaded(store: Store, revision: str) -> dict[str, list[dict[str, Any]]]:
    """Load the fixture; the rows it holds, as ROWS cut to the revision's columns."""
    await load(store, revision)
    assert await current_revision(store.db) == revision
    return rows_at(await store.db.read(columns_at))


async def columns_of_a_fresh(revision: str, like: Store) -> dict[str, dict[str, bool]]:
    """The tables and columns a database migrated straight to `revision` has (a downgrade must
    leave the same)."""
    if like.db.is_sqlite:
        with tempfile.TemporaryDirectory() as scratch:
            fresh = Store(f"sqlite+aiosqlite:///{Path(scratch) / 'fresh.db'}")
            try:
                await migrate_to(fresh, revision)
                return await fresh.db.read(columns_at)
            finally:
                await fresh.close()
    schema = f"t_{uuid.uuid4().hex[:12]}"
    await on_postgres(f'CREATE SCHEMA "{schema}"')
    fresh = Store(POSTGRES_URL, pg_schema=schema)
    try:
        await migrate_to(fresh, revision)
        return await fresh.db.read(columns_at)
    finally:
        await fresh.close()
        await on_postgres(f'DROP SCHEMA "{schema}" CASCADE')


async def still_there(store: Store, expected: dict[str, list[dict[str, Any]]]) -> None:
    """Every row of the fixture, read through today's tables, with every value it had."""

    def read(conn: Connection) -> dict[str, list[dict[str, Any]]]:
        return {name: [dict(r._mapping) for r in conn.execute(select(metadata.tables[name]))] for name in expected}

    found = await store.db.read(read)
    for table, rows in expected.items():
        key = [c.name for c in metadata.tables[table].primary_key]
        by_key = {tuple(row[k] for k in key): row for row in found[table]}
        assert len(found[table]) == len(rows), table
        for row in rows:
            now = by_key.get(tuple(row[k] for k in key))
            assert now is not None, f"{table} lost {row}"
            assert {c: now[c] for c in row} == row, table


# ---- what must still work -----------------------------------------------------------------------
async def still_works(store: Store, expected: dict[str, list[dict[str, Any]]]) -> None:
    await parked_approval_is_approved(store)
    await job_keeps_its_next_firing(store)
    await outbox_sends_what_its_state_says(store, expected)
    if "memories" in expected:
        await memory_is_read(store, expected)
    if "access_grants" in expected:
        grants = {(g.kind, g.channel, g.subject) for g in await store.access.grants()}
        assert grants == {("user", "telegram", "42"), ("chat", "slack", "C1")}


async def parked_approval_is_approved(store: Store) -> None:
    """The approval asked before the upgrade is decided after it by its button, as a tap would:
    the held message goes back to the queue and the parked run is resumed."""
    prompt = await store.prompts.by_token(PARKED_TOKEN)
    assert prompt is not None and prompt.status == "pending" and prompt.kind == "approval"
    assert [p.id for p in await store.prompts.pending(thread_key=TG_THREAD)] == [prompt.id]
    service = PromptService(store, outbox=None, config=Config.model_validate({}), clock=ManualClock(at(1)))  # type: ignore[arg-type]
    thread = ThreadKey.parse(TG_THREAD)
    # the requester's own approval needs an admin: the fixture's has none, so an operator decides
    press = ButtonPress(thread, ADA, button_token(PARKED_TOKEN, Action.APPROVE), "telegram:cb:1", operator=True)
    answer = await service.press(press)
    assert not answer.alert, answer.answer
    decided = await store.prompts.by_token(PARKED_TOKEN)
    assert decided is not None and (decided.status, decided.decision) == ("approved", Action.APPROVE)
    held = await store.inbox.get_by_event("telegram:update:900002")
    assert held is not None and held.status == "pending"
    resumes = [item for item in await store.inbox.pending(TG_THREAD) if item.kind == "resume"]
    assert len(resumes) == 1 and resumes[0].payload.get("prompt_id") == prompt.id, resumes


async def job_keeps_its_next_firing(store: Store) -> None:
    """The scheduler, started after the upgrade, plans the daily job at its next 09:00 from the
    firings recorded before it (none missed, none run again); the finished one-shot stays off."""

    async def no_submit(*_: Any, **__: Any) -> list[Any]:
        raise AssertionError("nothing is due")

    async def no_delivery(*_: Any) -> Delivered:
        raise AssertionError("nothing is delivered")

    runs_before = await store.schedules.count_runs()
    scheduler = Scheduler(
        store, SchedulerConfig(), submit=no_submit, deliver=no_delivery, now=lambda: at(1), manual_clock=True
    )
    await scheduler.start()
    try:
        assert scheduler.clock.planned() == {1: at(21)}  # 2026-12-02 09:00 UTC
        assert await store.schedules.last_firing(1) == at(-3)
        assert await store.schedules.count_runs() == runs_before
    finally:
        await scheduler.stop()


async def outbox_sends_what_its_state_says(store: Store, expected: dict[str, list[dict[str, Any]]]) -> None:
    """Pending is sent (after its retry time), sent and failed are not sent again."""
    assert [r.key for r in await store.outbox.undelivered()] == ["reply:3:2"]
    states = {r["key"]: r["status"] for r in expected["outbox"]}
    for key, status in states.items():
        record = await store.outbox.get(key)
        assert record is not None and record.status == status
    await store.outbox.mark_sent((await store.outbox.get("reply:3:2")).id, ["777"])  # type: ignore[union-attr]
    assert await store.outbox.undelivered() == []


async def memory_is_read(store: Store, expected: dict[str, list[dict[str, Any]]]) -> None:
    entries = await store.memory.list([OWNER])
    assert sorted(e.text for e in entries) == [
        "Prefers answers in British English.",
        "The backup job writes to /srv/backup every night.",
    ]
    # entries saved before their source was recorded say so (gateway/memory/provenance.py)
    recorded = "source" in expected["memories"][0]
    assert {e.source for e in entries} == ({"words"} if recorded else {"unknown"})
    found = await store.memory.search([OWNER], ["backup"])
    assert [e.text for e in found] == ["The backup job writes to /srv/backup every night."]
    saved = await store.memory.save(OWNER, "Lives in Leeds.", created_by="42", session_id=1)
    assert isinstance(saved, Saved) and saved.record.id > max(r["id"] for r in expected["memories"])
