"""Engine, transactions and migrations: SQLite (embedded default) or PostgreSQL.

SQLite runs in WAL mode with a busy timeout and foreign keys on; every write transaction starts
with BEGIN IMMEDIATE so two writers never deadlock on a lock upgrade, and writers inside one
process queue on an asyncio lock instead of spinning on SQLITE_BUSY.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import AsyncIterator, Awaitable, TypeVar

from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

T = TypeVar("T")
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


class StoreError(Exception):
    """A database problem worded for the operator."""


class Database:
    def __init__(self, url: str, *, echo: bool = False, pg_schema: str | None = None):
        self.url = url
        self.pg_schema = pg_schema
        parsed = make_url(url)
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        self._write_lock = asyncio.Lock() if self.is_sqlite else None
        if self.is_sqlite:
            database = parsed.database or ""
            if database and database != ":memory:":
                Path(database).parent.mkdir(parents=True, exist_ok=True)
            self.engine = self._sqlite_engine(url, echo, "BEGIN IMMEDIATE")
            # Reads run in autocommit (each statement sees the latest commit): no BEGIN/ROLLBACK
            # round trips to the driver thread for the many one-statement reads of a turn.
            self.read_engine = self._sqlite_engine(url, echo, None)
        else:
            # pg_schema isolates test databases (and lets several gateways share one server).
            connect_args = {"server_settings": {"search_path": pg_schema}} if pg_schema else {}
            self.engine = create_async_engine(
                url, echo=echo, pool_size=10, max_overflow=20, pool_pre_ping=True, connect_args=connect_args
            )
            self.read_engine = self.engine

    @staticmethod
    def _sqlite_engine(url: str, echo: bool, begin_sql: str | None) -> AsyncEngine:
        engine = create_async_engine(url, echo=echo, poolclass=NullPool if ":memory:" in url else None)

        @event.listens_for(engine.sync_engine, "connect")
        def _on_connect(dbapi_connection, _record):  # noqa: ANN001
            # Let us issue BEGIN ourselves (pysqlite's implicit transactions defer locking).
            dbapi_connection.isolation_level = None
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        @event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn):  # noqa: ANN001
            if begin_sql:
                conn.exec_driver_sql(begin_sql)

        return engine

    @contextlib.asynccontextmanager
    async def write(self) -> AsyncIterator[AsyncConnection]:
        """One write transaction, committed on exit.

        Connect, begin, commit, rollback and close always run to completion, so the write lock
        is never handed on while a connection still holds the database. Callers must not cancel
        a task in the middle of a statement either (SQLAlchemy then invalidates the connection,
        and a SQLite connection closed mid-statement can keep its lock): long-running work
        stops cooperatively (see turn.py, inbox.py), never by cancelling a database write.
        """
        lock = self._write_lock or contextlib.nullcontext()
        async with lock:
            conn = await _uninterrupted(self.engine.connect())
            try:
                await _uninterrupted(conn.begin())
                yield conn
                await _uninterrupted(conn.commit())
            except BaseException:
                await _uninterrupted(_rollback_and_close(conn))
                raise
            await _uninterrupted(conn.close())

    @contextlib.asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        conn = await _uninterrupted(self.read_engine.connect())
        try:
            yield conn
        finally:
            await _uninterrupted(conn.close())

    async def ping(self) -> bool:
        try:
            async with self.read() as conn:
                await conn.execute(text("SELECT 1"))
            return True
        except Exception:  # noqa: BLE001 - readiness reports, it does not raise
            return False

    async def dispose(self) -> None:
        await self.engine.dispose()
        if self.read_engine is not self.engine:
            await self.read_engine.dispose()


def _alembic_config(url: str):
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def _head_revision(url: str) -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config(url)).get_current_head()


async def current_revision(db: Database) -> str | None:
    def read(sync_conn) -> str | None:  # noqa: ANN001
        from alembic.runtime.migration import MigrationContext

        return MigrationContext.configure(sync_conn).get_current_revision()

    async with db.read() as conn:
        return await conn.run_sync(read)


async def migrations_current(db: Database) -> bool:
    return await current_revision(db) == _head_revision(db.url)


async def upgrade(db: Database) -> None:
    """Apply pending migrations (alembic upgrade head) over our own connection."""

    def run(sync_conn) -> None:  # noqa: ANN001
        from alembic import command

        cfg = _alembic_config(db.url)
        cfg.attributes["connection"] = sync_conn
        command.upgrade(cfg, "head")

    async with db.write() as conn:
        await conn.run_sync(run)


async def ensure_migrated(db: Database, *, auto_migrate: bool) -> None:
    if await migrations_current(db):
        return
    if not auto_migrate:
        raise StoreError(
            f"the database at {db.url} is not at the current schema and database.auto_migrate is "
            "false: run `gateway migrate` first"
        )
    await upgrade(db)


async def _uninterrupted(awaitable: Awaitable[T]) -> T:
    """Await to completion even if the caller is cancelled meanwhile (the cancel is re-raised
    after). Connection and transaction steps use it so that the write lock is never released
    while a connection still holds SQLite's lock or an open transaction."""
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done() and task.cancelled():
                raise
            if task.done():
                result = task.result()
                break
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


async def _rollback_and_close(conn: AsyncConnection) -> None:
    try:
        await conn.rollback()
    finally:
        await conn.close()
