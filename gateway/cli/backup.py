"""`gateway backup`, `gateway restore` and the backup `gateway migrate` takes first.

A SQLite backup is SQLite's online backup (one step: a consistent snapshot read while the
gateway goes on writing), named after what it holds: gateway-<version>-rev<schema>-<UTC time>.db,
in the database's directory unless told where. On PostgreSQL the gateway does not copy the
server's data: `backup` prints the `pg_dump` to run (the password masked) once it has found
pg_dump on PATH.

A restore refuses while an instance is serving on the database (its heartbeat lease is live:
gateway/running/leadership.py), checks the backup first (integrity, a schema revision this gateway
knows), and keeps the file it replaces beside it. Every outcome is one line.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gateway.cli.toplevel import installed_version
from gateway.config.redaction import redact_url
from gateway.events import OperatorError
from gateway.store import db as store_db
from gateway.store.db import SCHEMA_REVISION
from gateway.store.failures import SETTING, sqlite_file

STAMP = "%Y%m%dT%H%M%SZ"


def known_revisions() -> set[str]:
    """The schema revisions this gateway's migrations know (their files' four-digit prefixes)."""
    return {path.name[:4] for path in (Path(store_db.MIGRATIONS_DIR) / "versions").glob("[0-9][0-9][0-9][0-9]_*.py")}


def backup_name(revision: str | None, now: datetime, *, suffix: str = ".db") -> str:
    return f"gateway-{installed_version()}-rev{revision or 'none'}-{now.astimezone(UTC).strftime(STAMP)}{suffix}"


def _failure(line: str) -> OperatorError:
    return OperatorError(line, kind="backup")


def file_revision(path: Path) -> str | None:
    """The schema revision recorded in a SQLite file (None: no gateway schema in it), read only."""
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT version_num FROM alembic_version").fetchone()[0]
    except sqlite3.DatabaseError:
        return None
    finally:
        conn.close()


def copy_sqlite(source: Path, target: Path) -> None:
    """A consistent copy of `source` (its WAL included) at `target`, written beside it first and
    renamed into place: a copy cut short never takes the name."""
    partial = target.with_name(f".{target.name}.partial")
    partial.unlink(missing_ok=True)
    src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
    dst = sqlite3.connect(partial)
    try:
        src.backup(dst)  # pages=-1: one step, one read transaction, so one snapshot
        dst.execute("PRAGMA journal_mode=DELETE")  # one self-contained file (the gateway turns WAL back on)
    finally:
        dst.close()
        src.close()
    os.replace(partial, target)


def backup_sqlite(url: str, where: str | None, now: datetime) -> str:
    """Back the SQLite database up; returns the line saying where to."""
    source = sqlite_file(url)
    assert source is not None
    if not source.exists():
        raise _failure(f"there is no database at {source} to back up: check {SETTING}")
    revision = file_revision(source)
    name = backup_name(revision, now)
    target = Path(where) / name if where and Path(where).is_dir() else Path(where) if where else source.parent / name
    if target.exists():
        raise _failure(f"{target} already exists: name another file, or a directory, as PATH")
    try:
        copy_sqlite(source, target)
    except (OSError, sqlite3.Error) as exc:
        raise _failure(
            f"cannot back {source} up to {target} ({exc}): choose a writable place with room as PATH"
        ) from exc
    return f"backed up {source} (schema {revision}, gateway {installed_version()}) to {target}"


def pg_dump_line(url: str, revision: str | None, now: datetime) -> str:
    """The pg_dump to run for a PostgreSQL database, once pg_dump is found on PATH."""
    if shutil.which("pg_dump") is None:
        raise _failure(
            "pg_dump is not on PATH: install the PostgreSQL client tools (e.g. apt install postgresql-client), "
            "then run gateway backup again"
        )
    shown = redact_url(url.replace("+asyncpg", "").replace("+psycopg", ""))
    name = backup_name(revision, now, suffix=".dump")
    masked = " (with database.url's user and password in place of ••••)" if "••••" in shown else ""
    return f"run: pg_dump --format=custom --file={name} --dbname='{shown}'{masked}"


@dataclass(frozen=True)
class Checked:
    path: Path
    revision: str


def check_backup(path: Path) -> Checked:
    """The backup, if it is a sound gateway database this gateway can run on; else one line."""
    if not path.is_file():
        raise _failure(f"there is no backup at {path}: name a file gateway backup wrote")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            verdict = [row[0] for row in conn.execute("PRAGMA integrity_check")]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        raise _failure(f"{path} is not a SQLite database ({exc}): name a file gateway backup wrote") from exc
    if verdict != ["ok"]:
        raise _failure(f"{path} fails SQLite's integrity check ({verdict[0]}): restore another backup")
    revision = file_revision(path)
    if revision is None:
        raise _failure(f"{path} holds no gateway schema: name a file gateway backup wrote")
    if revision not in known_revisions():
        relation = "newer than" if revision > SCHEMA_REVISION else "unknown to"
        raise _failure(
            f"{path} is at schema {revision}, {relation} this gateway's {SCHEMA_REVISION} "
            f"(gateway {installed_version()}): restore it with the gateway version that wrote it"
        )
    return Checked(path, revision)


def replace_sqlite(target: Path, backup: Checked, now: datetime) -> str:
    """Put the backup in place of `target`, keeping `target` beside it; returns the line."""
    kept: Path | None = None
    if target.exists():
        _fold_wal(target)
        kept = target.with_name(f"{target.name}.replaced-{now.astimezone(UTC).strftime(STAMP)}")
        os.replace(target, kept)
        for side in ("-wal", "-shm"):
            target.with_name(target.name + side).unlink(missing_ok=True)  # empty after the fold
    try:
        copy_sqlite(backup.path, target)
    except (OSError, sqlite3.Error) as exc:
        if kept is not None:
            os.replace(kept, target)
        raise _failure(f"cannot write {target} ({exc}): free room or fix its directory's permissions") from exc
    after = f"; the file it replaced is kept at {kept}" if kept else ""
    behind = f"; gateway serve or gateway migrate brings it to schema {SCHEMA_REVISION}" if (
        backup.revision != SCHEMA_REVISION) else ""
    return f"restored {target} from {backup.path} (schema {backup.revision}){after}{behind}"


def _fold_wal(database: Path) -> None:
    """Write the WAL's pages into the file, so the file alone is the whole database."""
    conn = sqlite3.connect(database)
    try:
        busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
    finally:
        conn.close()
    if busy:
        raise _failure(f"{database} is in use by another process: stop it (gateway status, gateway chat), then restore")


async def serving_instances(url: str) -> list[str]:
    """The instances whose heartbeat is live on this database (none when it does not exist yet)."""
    from gateway.cli.database import opened

    async with opened(url, timeout_s=5) as (state, store):
        if store is None or state.revision is None:
            return []
        now = datetime.now(UTC)
        return [beat.instance_id for beat in await store.console.instances() if beat.expires_at > now]


async def run_backup(url: str, where: str | None) -> str:
    now = datetime.now(UTC)
    if sqlite_file(url) is not None:
        return backup_sqlite(url, where, now)
    from gateway.cli.database import opened

    async with opened(url, timeout_s=5) as (state, _store):
        if state.problem:
            raise OperatorError(state.problem, kind="database_unreachable")
        return pg_dump_line(url, state.revision, now)


async def run_restore(url: str, backup: str) -> str:
    now = datetime.now(UTC)
    target = sqlite_file(url)
    if target is None:
        shown = redact_url(url.replace("+asyncpg", "").replace("+psycopg", ""))
        raise _failure(
            f"gateway restore restores SQLite files; on PostgreSQL stop every instance, then run: "
            f"pg_restore --clean --if-exists --dbname='{shown}' {backup}"
        )
    checked = check_backup(Path(backup))
    if alive := await serving_instances(url):
        raise _failure(
            f"an instance is serving on {target} ({', '.join(alive)}): stop it, then run gateway restore again"
        )
    return replace_sqlite(target, checked, now)
