"""`gateway migrate`: a backup first (SQLite, unless --no-backup), then the migrations, all in
one transaction; a migration that fails leaves the database as it was and is named, with the
command that goes back to the copy taken before."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from gateway.cli.backup import backup_sqlite, file_revision
from gateway.events import OperatorError
from gateway.store import Store, StoreError
from gateway.store import db as store_db
from gateway.store.failures import sqlite_file


async def migrate(url: str, *, take_backup: bool, where: str) -> tuple[str | None, list[str]]:
    """Migrate the database; returns the revision it was at and the lines to print first."""
    lines: list[str] = []
    backup: str | None = None
    database = sqlite_file(url)
    if take_backup and database is not None and database.exists():
        found = file_revision(database)
        if found is not None and found < store_db.SCHEMA_REVISION:
            line = backup_sqlite(url, None, datetime.now(UTC))
            backup = line.rsplit(" to ", 1)[1]
            lines.append(line)
    applied: list[str] = []
    store = Store(url)
    try:
        before = await store_db.current_revision(store.db) if database is None or database.exists() else None
        found = await store.migrate(auto=True, applied=applied)
    except StoreError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the migration raised, named in one line
        raise await _failed(store, exc, applied, before, backup, where) from exc
    finally:
        await store.close()
    return found, lines


async def _failed(
    store: Store, exc: Exception, applied: list[str], before: str | None, backup: str | None, where: str
) -> OperatorError:
    now = await store_db.current_revision(store.db)
    state = f"is as it was, at schema {now}" if now == before else f"was left at schema {now}, not {before}"
    failing = _next_revision(applied[-1] if applied else now)
    said = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    back = (
        f"to go back to the copy taken before: gateway restore {backup}" if backup
        else "to go back: run the gateway version you ran before"
    )
    return OperatorError(
        f"migration {failing} failed ({said[0] if said else type(exc).__name__}): the database at {where} "
        f"{state}; {back}",
        kind="migration",
    )


def _next_revision(after: str | None) -> str:
    """The migration after `after` (four-digit revisions: their order is the text's)."""
    names = sorted(path.name for path in (Path(store_db.MIGRATIONS_DIR) / "versions").glob("[0-9]*_*.py"))
    return next((name.removesuffix(".py") for name in names if after is None or name[:4] > after), "?")
