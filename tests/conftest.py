"""Shared fixtures: a migrated store on SQLite and, when GATEWAY_TEST_POSTGRES_URL is set, PostgreSQL."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.store import Store

POSTGRES_URL = os.environ.get("GATEWAY_TEST_POSTGRES_URL", "")
# The same server as asyncpg takes it, for tests that talk to it below the store.
POSTGRES_DSN = POSTGRES_URL.replace("postgresql+asyncpg://", "postgresql://")
NO_POSTGRES = "GATEWAY_TEST_POSTGRES_URL is not set (CI sets it; e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/test)"


async def on_postgres(sql: str) -> None:
    """One statement on the test server, outside any store (creating and dropping places)."""
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_DSN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


_sqlite_template: Path | None = None


async def migrated_sqlite_template() -> Path:
    """A SQLite database migrated to head once per test process: each test's fresh store is a
    copy of it (the 27 migrations took ~0.1 s a test, for ~800 tests). The migrations
    themselves are tested from empty and from every released revision in test_migrations*.py."""
    global _sqlite_template  # noqa: PLW0603
    if _sqlite_template is None or not _sqlite_template.exists():
        folder = tempfile.mkdtemp(prefix="gateway-template-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        path = Path(folder) / "gateway.db"
        template = Store(f"sqlite+aiosqlite:///{path}")
        await template.migrate()
        await template.close()  # checkpoints the WAL into the file
        _sqlite_template = path
    return _sqlite_template


async def make_store(kind: str, tmp_path) -> tuple[Store, object]:
    """A fresh, migrated store and a cleanup coroutine factory."""
    if kind == "sqlite":
        template = await migrated_sqlite_template()
        target = tmp_path / "gateway.db"
        for suffix in ("", "-wal"):  # a WAL the close left would hold part of the schema
            if Path(f"{template}{suffix}").exists():
                shutil.copy2(f"{template}{suffix}", f"{target}{suffix}")  # its mode too: 0600
        store = Store(f"sqlite+aiosqlite:///{target}")
        await store.migrate()  # at head already: one read of its revision
        return store, None
    if not POSTGRES_URL:
        pytest.skip(NO_POSTGRES)
    template = await migrated_postgres_template()
    if template is not None:  # a database of its own, copied from the migrated template
        name = f"gw_t_{uuid.uuid4().hex[:12]}"
        await on_postgres(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        store = Store(database_url_named(name))
        await store.migrate()  # at head already: one read of its revision

        async def drop_database() -> None:
            await on_postgres(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        return store, drop_database
    schema = f"t_{uuid.uuid4().hex[:12]}"  # no right to create databases: a schema, migrated
    await on_postgres(f'CREATE SCHEMA "{schema}"')
    store = Store(POSTGRES_URL, pg_schema=schema)
    await store.migrate()

    async def drop() -> None:
        await on_postgres(f'DROP SCHEMA "{schema}" CASCADE')

    return store, drop


def database_url_named(name: str) -> str:
    """GATEWAY_TEST_POSTGRES_URL's server, another database."""
    from sqlalchemy.engine import make_url

    return make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)


def dsn_of(store: Store) -> str:
    """The asyncpg DSN of the database `store` is on (with its schema: `store.db.pg_schema`)."""
    return store.db.url.replace("postgresql+asyncpg://", "postgresql://")


_postgres_template: str | None = None
_postgres_template_refused = False


async def migrated_postgres_template() -> str | None:
    """A database migrated to head once per test process, which each PostgreSQL test's fresh
    database is created from (`CREATE DATABASE ... TEMPLATE`: ~20 ms, where the migrations in a
    new schema took ~0.3 s); dropped at exit. None where the role may not create databases."""
    global _postgres_template, _postgres_template_refused  # noqa: PLW0603
    if _postgres_template is not None or _postgres_template_refused:
        return _postgres_template
    import asyncpg

    name = f"gw_template_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        await on_postgres(f'CREATE DATABASE "{name}"')
    except asyncpg.InsufficientPrivilegeError:
        _postgres_template_refused = True
        return None
    atexit.register(_drop_postgres_database, name)
    template = Store(database_url_named(name))
    try:
        await template.migrate()
    finally:
        await template.close()  # a template may have no connection when it is copied
    _postgres_template = name
    return name


def _drop_postgres_database(name: str) -> None:
    import asyncio

    asyncio.run(on_postgres(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def clock():
    """A clock the test advances by hand (`clock.advance(seconds)`), for expiries and timeouts;
    hand it to the code under test (`running_gateway(..., clock=clock)`)."""
    from helpers import ManualClock

    return ManualClock()


@pytest.fixture
async def llm(request):
    """The scripted OpenAI-compatible server (tests/fakes/llm.py) on a random local port; with
    `helpers.every_api` (indirect parametrization), the fake of each API in turn, whose
    `settings` are the `llm` section that speaks it."""
    from fakes.anthropic import FakeAnthropic
    from fakes.llm import FakeLLM
    from fakes.llm_responses import FakeResponses

    api = getattr(request, "param", "chat")
    fake = {"chat": FakeLLM, "anthropic": FakeAnthropic, "responses": FakeResponses}[api]()
    async with fake as server:
        yield server


@pytest.fixture
async def tg():
    """The fake Telegram Bot API (tests/fakes/telegram.py) on a random local port."""
    from fakes.telegram import FakeTelegram

    async with FakeTelegram() as server:
        yield server


@pytest.fixture
async def slack():
    """The fake Slack Web API with signed event delivery (tests/fakes/slack.py)."""
    from fakes.slack import FakeSlack

    async with FakeSlack() as server:
        yield server


@pytest.fixture
async def otlp():
    """An OTLP/HTTP trace receiver, as a collector's (tests/fakes/otlp.py), on a random local port."""
    from fakes.otlp import OtlpReceiver

    async with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(params=["sqlite", "postgres"])
def db_kind(request) -> str:
    return request.param


@pytest.fixture
async def store(db_kind, tmp_path):
    store, drop = await make_store(db_kind, tmp_path)
    try:
        yield store
    finally:
        await store.close()
        if drop is not None:
            await drop()


@pytest.fixture
async def database_url(db_kind: str, tmp_path) -> AsyncIterator[str]:
    """A database of its own, never migrated (a gateway process migrates it like a fresh install)."""
    if db_kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'gateway.db'}"
        return
    if not POSTGRES_URL:
        pytest.skip(NO_POSTGRES)
    name = f"t_{uuid.uuid4().hex[:10]}"
    await on_postgres(f'CREATE DATABASE "{name}"')
    try:
        yield POSTGRES_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        await on_postgres(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def sqlite_store(tmp_path):
    store, _ = await make_store("sqlite", tmp_path)
    try:
        yield store
    finally:
        await store.close()
