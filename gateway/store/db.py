"""Engine, transactions and migrations: SQLite (embedded default) or PostgreSQL.

Every store operation is a plain function of a SQLAlchemy `Connection` that the repositories
hand to `Database.write` (one transaction, committed) or `Database.read`. How it runs depends on
the engine:

- SQLite runs it synchronously on the event loop's thread. A local statement takes tens of
  microseconds, while hopping to a driver thread costs hundreds per statement (the async driver
  makes four hops per statement), and a turn issues dozens. WAL mode means readers never wait;
  writes start with BEGIN IMMEDIATE and, on the loop's connection, never wait either
  (busy_timeout 0): when another process holds the write lock, the same work is re-run on a
  writer thread that waits for it. Reads that may be large go to a reader thread, and WAL
  checkpoints (the only fsync) run on the writer thread, so the loop never blocks on disk.
- PostgreSQL runs it through the asyncio engine (asyncpg) with `run_sync`; reads in autocommit
  (each statement one round trip), writes in a READ COMMITTED transaction.

Either way the work runs to completion once started: a task cancelled meanwhile gets its
CancelledError after the transaction has committed or rolled back, never in the middle.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError, ProgrammingError, SQLAlchemyError

from gateway.files.private_files import close_to_others, create_private, make_dirs
from gateway.store.disk import WriteHealth
from gateway.store.failures import (
    driver_missing,
    parse_database_url,
    schema_behind,
    schema_newer,
    sqlite_unusable,
)

T = TypeVar("T")
Work = Callable[[Connection], T]
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
BUSY_TIMEOUT_MS = 30_000
CHECKPOINT_EVERY_WRITES = 200  # a passive WAL checkpoint on the writer thread after this many
READER_THREADS = 4
# The revision of the newest migration in gateway/migrations/versions (a test keeps the two equal).
SCHEMA_REVISION = "0029"
_VERSION_QUERY = text("SELECT version_num FROM alembic_version")
WRITE_ISOLATION = "READ COMMITTED"  # PostgreSQL's default: what every write transaction runs at

log = logging.getLogger(__name__)


class StatementCount:
    """Statements and transactions sent to the database (on PostgreSQL each statement is a
    round trip, and a transaction adds its BEGIN and COMMIT): reported by /metrics."""

    def __init__(self) -> None:
        self.statements = 0
        self.transactions = 0

    def watch(self, engine: Engine) -> None:
        event.listen(engine, "after_cursor_execute", self._statement)
        event.listen(engine, "commit", self._transaction)

    def _statement(self, *_: object) -> None:
        self.statements += 1

    def _transaction(self, *_: object) -> None:
        self.transactions += 1


POOL_SIZE, MAX_OVERFLOW = 10, 20  # PostgreSQL connections per instance: kept open, and opened beyond that at peaks


class Database:
    def __init__(
        self,
        url: str,
        *,
        echo: bool = False,
        pg_schema: str | None = None,
        pool_size: int = POOL_SIZE,
        max_overflow: int = MAX_OVERFLOW,
        application_name: str = "gateway",
    ):
        self.url = url
        self.pg_schema = pg_schema
        self.count = StatementCount()
        parsed = self.parsed_url = parse_database_url(url)  # one line naming database.url when unusable
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        if self.is_sqlite:
            database = parsed.database or ""
            if database and database != ":memory:":
                try:
                    private_sqlite(Path(database))
                except OSError as exc:
                    raise sqlite_unusable(parsed, exc) from exc
            on_disk = Path(database).resolve() if database and database != ":memory:" else None
            self._sqlite = _SQLite(parsed.set(drivername="sqlite+pysqlite"), echo, WriteHealth(on_disk))
            self.count.watch(self._sqlite.writer_engine)
            self.count.watch(self._sqlite.reader_engine)
        else:
            from sqlalchemy.ext.asyncio import create_async_engine  # (and the ORM it loads) PostgreSQL only

            # pg_schema isolates test databases (and lets several gateways share one server).
            # The application name tells each instance's connections apart in pg_stat_activity.
            settings = {"application_name": application_name[:63]}
            if pg_schema:
                settings["search_path"] = pg_schema
            connect_args = {"server_settings": settings}
            # Connections are in autocommit unless a write begins a transaction: a read then
            # costs its statements alone (no BEGIN and ROLLBACK around them, the same snapshot
            # per statement as READ COMMITTED gives), and the pool's ping one round trip, not three.
            try:
                self.engine = create_async_engine(
                    url,
                    echo=echo,
                    pool_size=pool_size,  # at most pool_size + max_overflow connections: docs/operations.md, Sizing
                    max_overflow=max_overflow,
                    pool_pre_ping=True,
                    connect_args=connect_args,
                    isolation_level="AUTOCOMMIT",
                )
            except ImportError as exc:
                raise driver_missing(parsed) from exc
            self.count.watch(self.engine.sync_engine)

    async def write(self, work: Work[T]) -> T:
        """Run `work(conn)` in one write transaction, committed when it returns (rolled back
        and re-raised when it raises); returns what it returned."""
        if self.is_sqlite:
            return await self._sqlite.write(work)
        return await _uninterrupted(self._pg_run(work, transaction=True))

    @property
    def unwritable(self) -> str | None:
        """Why the database's disk refuses writes (full, read-only), as the last write found; None
        while writes succeed (and on PostgreSQL, whose server reports its own disk)."""
        return self._sqlite.health.line if self.is_sqlite else None

    async def read(self, work: Work[T], *, large: bool = False) -> T:
        """Run `work(conn)` for reading. `large` marks reads that may take long (whole
        histories, reports): on SQLite they run on a reader thread instead of the loop."""
        if self.is_sqlite:
            return await self._sqlite.read(work, large=large)
        return await _uninterrupted(self._pg_run(work, transaction=False))

    async def _pg_run(self, work: Work[T], *, transaction: bool) -> T:
        async with self.engine.connect() as conn:
            return await conn.run_sync(_in_transaction if transaction else _call, work)

    async def ping(self) -> bool:
        try:
            await self.read(lambda conn: conn.execute(text("SELECT 1")).scalar())
            return True
        except (SQLAlchemyError, OSError):  # down, refusing, timed out: readiness reports, it does not raise
            return False

    async def flush_erased(self) -> None:
        """After words were erased: on SQLite the WAL, which still holds the pages as they were,
        is copied into the database file and emptied (a checkpoint that cannot finish because a
        reader holds an old snapshot is logged; the next one finishes it). PostgreSQL keeps old
        row versions until VACUUM reclaims them (docs/memory.md says so)."""
        if self.is_sqlite:
            await self._sqlite.truncate_wal()

    async def migrate(self, run: Work[None]) -> None:
        """Run a migration step (alembic) in one transaction, off the event loop."""
        if self.is_sqlite:
            await self._sqlite.migrate(run)
        else:
            await self.write(run)

    async def dispose(self) -> None:
        if self.is_sqlite:
            await self._sqlite.dispose()
        else:
            await self.engine.dispose()


SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")


def private_sqlite(database: Path) -> None:
    """The database and its WAL, shared memory and journal are 0600, its directory 0700 when the
    gateway creates it. An install from before (created under umask 022: 0644, 0755) is closed
    here, and the log says so once; an existing directory is closed when it holds nothing but
    the database (it is then the gateway's own, like `data/`)."""
    folder = database.parent
    existed = folder.is_dir()
    make_dirs(folder)
    create_private(database)
    files = [database, *(database.with_name(database.name + side) for side in SQLITE_SIDE_FILES)]
    closed = [path for path in files if close_to_others(path)]
    if existed and {entry.name for entry in folder.iterdir()} <= {path.name for path in files}:
        closed += [folder] if close_to_others(folder) else []
    if closed:
        log.warning(
            "closed the database to other users of this machine (they could read it): %s now 0600/0700",
            ", ".join(str(path) for path in closed),
        )


class MigrationBrokeReferences(RuntimeError):
    """A migration left rows that refer to rows that are not there (it is rolled back)."""

    def __init__(self, count: int, first: str):
        super().__init__(f"a migration left {count} rows referring to missing rows (first: {first}); nothing changed")


class _SQLite:
    """SQLite through the synchronous driver: the loop's own connections for the common case,
    threads for waiting on another process's lock, large reads and checkpoints."""

    def __init__(self, url, echo: bool, health: WriteHealth):  # noqa: ANN001
        self.health = health
        self.writer_engine = _sqlite_engine(url, echo, begin_sql="BEGIN IMMEDIATE")
        self.reader_engine = _sqlite_engine(url, echo, begin_sql=None)
        self._writer_thread = ThreadPoolExecutor(1, thread_name_prefix="sqlite-writer")
        self._reader_threads = ThreadPoolExecutor(READER_THREADS, thread_name_prefix="sqlite-reader")
        self._loop_writer: Connection | None = None
        self._loop_reader: Connection | None = None
        self._writes_since_checkpoint = 0
        self._checkpoint: asyncio.Future | None = None

    async def write(self, work: Work[T]) -> T:
        """A write the disk refuses (full, read-only) raises `DatabaseUnwritable`, said once
        (gateway/store/disk.py); the next one that succeeds says the disk is back."""
        try:
            result = self._write_on_loop(work)
            if result is _LOCKED:
                result = await self.in_writer_thread(work)
        except (SQLAlchemyError, sqlite3.Error) as exc:
            if (refused := self.health.refused(exc)) is None:
                raise
            raise refused from exc
        self.health.succeeded()
        self._writes_since_checkpoint += 1
        if self._writes_since_checkpoint >= CHECKPOINT_EVERY_WRITES:
            self._start_checkpoint()
        return result  # type: ignore[return-value]

    async def read(self, work: Work[T], *, large: bool) -> T:
        if large:
            return await self._in_thread(self._reader_threads, lambda: self._read_pooled(work))
        conn = self._loop_reader
        if conn is None or conn.invalidated:
            conn = self._loop_reader = self.reader_engine.connect()
        try:
            return work(conn)
        finally:
            conn.rollback()  # ends SQLAlchemy's transaction; the driver is in autocommit

    async def in_writer_thread(self, work: Work[T]) -> T:
        return await self._in_thread(self._writer_thread, lambda: self._write_pooled(work))

    def _write_on_loop(self, work: Work[T]) -> T | object:
        conn = self._loop_writer
        if conn is None or conn.invalidated:
            conn = self._loop_writer = self.writer_engine.connect()
            driver = conn.connection.driver_connection
            assert driver is not None
            driver.execute("PRAGMA busy_timeout=0")  # never wait on the loop
        try:
            transaction = conn.begin()
        except (OperationalError, sqlite3.OperationalError) as exc:
            if not _is_locked(exc):
                raise
            conn.rollback()
            return _LOCKED
        with transaction:
            return work(conn)

    async def migrate(self, work: Work[None]) -> None:
        await self._in_thread(self._writer_thread, lambda: self._migrate_pooled(work))

    def _migrate_pooled(self, work: Work[None]) -> None:
        """A migration that rebuilds a table (alembic's batch mode: copy, DROP, rename) runs with
        foreign keys off, as SQLite's own procedure for it says: with them on, the DROP deletes
        every row first and cascades to the rows that refer to them (a session's messages).
        The references are checked before the commit instead."""
        with self.writer_engine.connect() as conn:
            driver = conn.connection.driver_connection
            assert driver is not None
            driver.execute("PRAGMA foreign_keys=OFF")  # only outside a transaction does it take
            try:
                with conn.begin():
                    work(conn)
                    broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if broken:
                        raise MigrationBrokeReferences(len(broken), str(tuple(broken[0])))
            finally:
                driver.execute("PRAGMA foreign_keys=ON")

    def _write_pooled(self, work: Work[T]) -> T:
        with self.writer_engine.begin() as conn:
            return work(conn)

    def _read_pooled(self, work: Work[T]) -> T:
        with self.reader_engine.connect() as conn:
            return work(conn)

    async def _in_thread(self, pool: ThreadPoolExecutor, call: Callable[[], T]) -> T:
        return await _uninterrupted(asyncio.get_running_loop().run_in_executor(pool, call))

    def _start_checkpoint(self) -> None:
        if self._checkpoint is not None and not self._checkpoint.done():
            return
        self._writes_since_checkpoint = 0
        self._checkpoint = asyncio.get_running_loop().run_in_executor(self._writer_thread, self._checkpoint_now)

    def _checkpoint_now(self) -> None:
        try:
            with self.reader_engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
        except (SQLAlchemyError, OSError) as exc:  # busy or locked: the next checkpoint catches up
            if self.health.refused(exc) is None:  # a full or read-only disk is said once, as for a write
                log.warning("WAL checkpoint failed", exc_info=True)

    async def truncate_wal(self) -> None:
        await self._in_thread(self._writer_thread, self._truncate_now)

    def _truncate_now(self) -> None:
        with self.reader_engine.connect() as conn:  # outside a transaction, like every checkpoint
            busy = conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)").scalar()
        if busy:
            log.warning("the WAL still holds erased pages: a reader kept it from being emptied (the next one does)")

    async def dispose(self) -> None:
        if self._checkpoint is not None:
            await asyncio.wait([self._checkpoint])
        for conn in (self._loop_writer, self._loop_reader):
            if conn is not None:
                conn.close()
        self._loop_writer = self._loop_reader = None
        await asyncio.get_running_loop().run_in_executor(self._writer_thread, self._checkpoint_now)
        self._writer_thread.shutdown(wait=True)
        self._reader_threads.shutdown(wait=True)
        self.writer_engine.dispose()
        self.reader_engine.dispose()


_LOCKED = object()
CACHE_KIB = 16_384


def _sqlite_engine(url, echo: bool, *, begin_sql: str | None) -> Engine:  # noqa: ANN001
    engine = create_engine(url, echo=echo, connect_args={"check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):  # noqa: ANN001
        # Let us issue BEGIN ourselves (pysqlite's implicit transactions defer locking).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        # Checkpoints (fsync) run on the writer thread, not inside a commit on the loop.
        cursor.execute("PRAGMA wal_autocheckpoint=0")
        # What is deleted or overwritten is zeroed in the file, not left in free space: a
        # forgotten memory entry or an erased person is not in the database file either.
        cursor.execute("PRAGMA secure_delete=ON")
        cursor.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        cursor.close()

    if begin_sql:

        @event.listens_for(engine, "begin")
        def _on_begin(conn):  # noqa: ANN001
            # Straight to the driver: this runs for every write, and SQLAlchemy's statement
            # machinery costs more than the BEGIN itself.
            conn.connection.driver_connection.execute(begin_sql)

    return engine


def _is_locked(exc: Exception) -> bool:
    message = str(getattr(exc, "orig", exc)).lower()
    return "locked" in message or "busy" in message


def _in_transaction(conn: Connection, work: Work[T]) -> T:
    conn.execution_options(isolation_level=WRITE_ISOLATION)  # back to autocommit when returned to the pool
    with conn.begin():
        return work(conn)


def _call(conn: Connection, work: Work[T]) -> T:
    return work(conn)


def _alembic_config(url: str):
    from alembic.config import Config as AlembicConfig

    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def head_revision() -> str | None:
    """The newest migration, as alembic finds it in gateway/migrations (loads every script)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_alembic_config("sqlite://")).get_current_head()


async def current_revision(db: Database) -> str | None:
    """The schema's revision, read from alembic's own table in one query (None before the
    first migration): a start on a current schema loads none of alembic's machinery."""

    def read(conn: Connection) -> str | None:
        try:
            return conn.execute(_VERSION_QUERY).scalar()
        except (OperationalError, ProgrammingError):  # no alembic_version table yet
            return None

    return await db.read(read)


async def migrations_current(db: Database) -> bool:
    return await current_revision(db) == SCHEMA_REVISION


# pg_advisory_xact_lock's key for migrating (any constant; "gwmigrat" in ASCII).
MIGRATION_LOCK_KEY = int.from_bytes(b"gwmigrat", "big") >> 1


async def upgrade(db: Database, applied: list[str] | None = None) -> None:
    """Apply pending migrations (alembic upgrade head) over our own connection, in one
    transaction (SQLite's DDL is transactional too: a failure leaves the schema as it was).
    `applied` is appended each migration's revision as it is applied (before the commit)."""

    def run(conn: Connection) -> None:
        from alembic import command

        if conn.dialect.name == "postgresql":
            # Instances starting together each migrate: the first applies, the others wait here
            # (the lock is the transaction's) and then find the version table at head.
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        cfg = _alembic_config(db.url)
        cfg.attributes["connection"] = conn
        if applied is not None:
            cfg.attributes["on_version_apply"] = [lambda step, **_: applied.append(step.up_revision_id)]
        command.upgrade(cfg, "head")

    await db.migrate(run)


async def ensure_migrated(db: Database, *, auto_migrate: bool, applied: list[str] | None = None) -> str | None:
    """Bring the schema to SCHEMA_REVISION; returns the revision the database was at (None: it
    was new). A schema newer than ours is refused: migrating it down is not ours to do."""
    found = await current_revision(db)
    if found == SCHEMA_REVISION:
        return found
    if found is not None and found > SCHEMA_REVISION:  # four-digit revisions: their order is the text's
        raise schema_newer(db.parsed_url, found, SCHEMA_REVISION)
    if not auto_migrate:
        raise schema_behind(db.parsed_url, found, SCHEMA_REVISION)
    await upgrade(db, applied)
    return found


async def _uninterrupted(awaitable: Awaitable[T]) -> T:
    """Await to completion even if the caller is cancelled meanwhile, so a transaction is never
    abandoned half way. A cancel that arrived meanwhile is re-raised after, whatever the
    transaction's outcome: losing it leaves the canceller waiting on a task that goes on."""
    task = asyncio.ensure_future(awaitable)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait({task})  # unlike shield, raises only the caller's own cancel
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancel supersedes the outcome
        raise asyncio.CancelledError
    return task.result()
