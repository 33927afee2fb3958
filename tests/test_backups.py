"""Backups and upgrades: `gateway backup` while serving and `gateway restore` after (the same
conversations), a restore refused while an instance serves or of a backup that is unsound or
too new, `gateway migrate` backing up first and leaving the database as it was when a migration
fails (SQLite's DDL is transactional: proved on a migration that rebuilds a table), and old code
refusing a newer schema in one line."""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from conftest import POSTGRES_URL
from fakes.llm import user_texts
from sqlalchemy import select
from test_first_hour_failures import gateway, serve, write
from test_telegram_e2e import PRIVATE, running, settle, texts, tg_config

from gateway.__main__ import main
from gateway.cli.backup import run_backup, run_restore
from gateway.cli.toplevel import EXIT_CODES, installed_version
from gateway.events import OperatorError
from gateway.store import Store
from gateway.store import db as store_db
from gateway.store.db import SCHEMA_REVISION
from gateway.store.tables import messages


async def conversation(store: Store) -> list[tuple[int, int, str, str]]:
    def read(conn):  # noqa: ANN001, ANN202
        rows = conn.execute(select(messages.c.session_id, messages.c.seq, messages.c.role, messages.c.content)
                            .order_by(messages.c.session_id, messages.c.seq))
        return [tuple(row) for row in rows]

    return await store.db.read(read)


def database_file(store: Store) -> Path:
    return Path(store.db.url.split(":///", 1)[1])


async def test_a_backup_taken_while_serving_restores_the_same_conversations(llm, tg, tmp_path) -> None:
    url, folder = f"sqlite+aiosqlite:///{tmp_path / 'gateway.db'}", tmp_path / "backups"
    folder.mkdir()
    store = Store(url)
    await store.migrate()
    config = tg_config(llm, tg, tmp_path)
    llm.reply("first answer")
    llm.reply("second answer")
    async with running(store, config) as gateway_:
        tg.private_message(PRIVATE, "first question")
        await settle(gateway_, lambda: len(texts(tg, PRIVATE)) == 1)
        line = await run_backup(url, str(folder))
        at_backup = await conversation(store)
        with pytest.raises(OperatorError, match="an instance is serving on .*stop it, then run gateway restore again"):
            await run_restore(url, str(next(folder.iterdir())))
        tg.private_message(PRIVATE, "second question")  # after the backup: not in it
        await settle(gateway_, lambda: len(texts(tg, PRIVATE)) == 2)
    assert await conversation(store) != at_backup
    await store.close()

    (backup,) = folder.iterdir()
    assert backup.name.startswith(f"gateway-{installed_version()}-rev{SCHEMA_REVISION}-") and backup.suffix == ".db"
    source = database_file(store)
    assert line == f"backed up {source} (schema {SCHEMA_REVISION}, gateway {installed_version()}) to {backup}"
    restored = await run_restore(url, str(backup))
    (kept,) = database_file(store).parent.glob("gateway.db.replaced-*")
    assert restored == (
        f"restored {source} from {backup} (schema {SCHEMA_REVISION}); the file it replaced is kept at {kept}"
    )
    with sqlite3.connect(kept) as replaced:  # the file replaced still holds what came after
        assert replaced.execute("SELECT count(*) FROM messages WHERE content = 'second question'").fetchone()[0] == 1

    again = Store(url)
    try:
        assert await again.migrate() == SCHEMA_REVISION
        assert await conversation(again) == at_backup
        llm.reply("third answer")
        async with running(again, config) as gateway_:  # and it serves on: the model sees the first exchange
            tg.private_message(PRIVATE, "third question")
            await settle(gateway_, lambda: len(texts(tg, PRIVATE)) == 3)
        assert user_texts(llm.requests[-1]) == ["first question", "third question"]
    finally:
        await again.close()


def sqlite_database(tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / "data" / "gateway.db"
    return f"sqlite+aiosqlite:///{path}", path


async def migrated(url: str) -> None:
    store = Store(url)
    try:
        await store.migrate()
    finally:
        await store.close()


async def test_a_restore_checks_the_backup_first_and_changes_nothing_when_it_fails(tmp_path) -> None:
    url, path = sqlite_database(tmp_path)
    await migrated(url)
    before = path.read_bytes()
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database" * 100)
    with pytest.raises(OperatorError, match=r"garbage.db is not a SQLite database \(.*\): name a file gateway backup"):
        await run_restore(url, str(garbage))

    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(OperatorError, match="empty.db holds no gateway schema"):
        await run_restore(url, str(empty))

    newer = tmp_path / "newer.db"
    await run_backup(url, str(newer))
    with sqlite3.connect(newer) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    conn.close()
    with pytest.raises(OperatorError) as refused:
        await run_restore(url, str(newer))
    assert str(refused.value) == (
        f"{newer} is at schema 9999, newer than this gateway's {SCHEMA_REVISION} (gateway {installed_version()}): "
        "restore it with the gateway version that wrote it"
    )
    assert path.read_bytes() == before and not list(path.parent.glob("*.replaced-*"))


async def test_backup_and_restore_from_the_command_line_are_one_line_each(tmp_path) -> None:
    config = write(tmp_path)
    assert (await gateway("migrate", "--config", str(config), cwd=tmp_path)).code == 0
    taken = await gateway("backup", "--config", str(config), cwd=tmp_path)
    (backup,) = (tmp_path / "data").glob("gateway-*.db")  # beside the database by default
    assert taken.code == 0 and taken.out.strip().endswith(f" to {backup}")
    again = await gateway("backup", str(backup), "--config", str(config), cwd=tmp_path)
    assert again.code == EXIT_CODES["backup"]
    assert again.one_line() == f"gateway: {backup} already exists: name another file, or a directory, as PATH"
    restored = await gateway("restore", str(backup), "--config", str(config), cwd=tmp_path)
    assert restored.code == 0 and len(restored.out.strip().splitlines()) == 1
    missing = await gateway("restore", "nothing.db", "--config", str(config), cwd=tmp_path)
    assert missing.code == EXIT_CODES["backup"]
    assert missing.one_line() == "gateway: there is no backup at nothing.db: name a file gateway backup wrote"


@pytest.mark.skipif(not POSTGRES_URL, reason="GATEWAY_TEST_POSTGRES_URL is not set")
async def test_on_postgresql_backup_prints_the_pg_dump_to_run_without_the_password(tmp_path, monkeypatch) -> None:
    url = POSTGRES_URL.replace("://postgres@", "://postgres:hunter2-secret@")
    if shutil.which("pg_dump") is not None:
        line = await run_backup(url, None)
        assert line.startswith(f"run: pg_dump --format=custom --file=gateway-{installed_version()}-rev")
        server = urlsplit(POSTGRES_URL)
        where = f"postgresql://••••@{server.netloc.rsplit('@', 1)[-1]}{server.path}"
        assert line.endswith(f".dump --dbname='{where}' (with database.url's user and password in place of ••••)")
        assert "hunter2-secret" not in line
    monkeypatch.setenv("PATH", str(tmp_path))  # no pg_dump there
    with pytest.raises(OperatorError, match="pg_dump is not on PATH: install the PostgreSQL client tools"):
        await run_backup(url, None)
    with pytest.raises(OperatorError, match="on PostgreSQL stop every instance, then run: pg_restore") as refused:
        await run_restore(url, "x.dump")
    assert "hunter2-secret" not in str(refused.value)


BROKEN = '''"""Rebuilds sessions with a new column, writes rows, then fails (a test's injected failure)."""

import sqlalchemy as sa
from alembic import op

revision = "{revision}"
down_revision = "{down}"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table("broken_probe", sa.Column("id", sa.Integer, primary_key=True))
    with op.batch_alter_table("sessions", recreate="always") as batch:
        batch.add_column(sa.Column("broken", sa.Integer, nullable=True))
    op.execute("DELETE FROM messages")
    raise RuntimeError("injected failure")


def downgrade() -> None:
    pass
'''


def dump(path: Path) -> list[str]:
    with sqlite3.connect(path) as conn:
        lines = list(conn.iterdump())
    conn.close()
    return lines


def test_a_failed_migration_leaves_the_database_as_it_was_and_says_the_way_back(
    tmp_path, monkeypatch, capsys
) -> None:
    import asyncio

    url, path = sqlite_database(tmp_path)
    asyncio.run(migrated(url))
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO threads (key, channel, created_at) VALUES ('telegram:1', 'telegram', '2026-01-01')")
        conn.execute(
            "INSERT INTO sessions (id, thread_key, kind, interactive, ephemeral, source, started_by, next_seq, notes,"
            " created_at) VALUES (1, 'telegram:1', 'interactive', 1, 0, 'telegram', '', 2, '{}', '2026-01-01')"
        )
        conn.execute(
            "INSERT INTO messages (session_id, seq, role, content, status, synthetic, created_at)"
            " VALUES (1, 1, 'user', 'kept through a failed upgrade', 'ok', 0, '2026-01-01')"
        )
    conn.close()
    before = dump(path)
    scripts = tmp_path / "migrations"
    shutil.copytree(store_db.MIGRATIONS_DIR, scripts, ignore=shutil.ignore_patterns("__pycache__"))
    broken = f"{int(SCHEMA_REVISION) + 1:04d}"
    (scripts / "versions" / f"{broken}_broken.py").write_text(BROKEN.format(revision=broken, down=SCHEMA_REVISION))
    monkeypatch.setattr(store_db, "MIGRATIONS_DIR", scripts)
    monkeypatch.setattr(store_db, "SCHEMA_REVISION", broken)  # the code this test pretends to be
    config = write(tmp_path, f"database:\n  url: {url}\n")
    monkeypatch.setattr(sys, "argv", ["gateway"])

    code = main(["migrate", "--config", str(config)])

    err = capsys.readouterr().err.strip()
    (backup,) = path.parent.glob("gateway-*.db")
    assert code == EXIT_CODES["migration"]
    assert err == (
        f"gateway: migration {broken}_broken failed (injected failure): the database at {path} is as it was, "
        f"at schema {SCHEMA_REVISION}; to go back to the copy taken before: gateway restore {backup}"
    )
    assert dump(path) == before  # the rebuilt table, the new one and the deleted rows all rolled back
    assert dump(backup) == before  # and the copy taken first holds the same

    capsys.readouterr()
    assert main(["migrate", "--no-backup", "--config", str(config)]) == EXIT_CODES["migration"]
    assert capsys.readouterr().err.strip().endswith("to go back: run the gateway version you ran before")
    assert len(list(path.parent.glob("gateway-*.db"))) == 1  # --no-backup took none


async def test_old_code_on_a_newer_schema_refuses_to_serve_in_one_line(tmp_path) -> None:
    config = write(tmp_path)
    assert (await gateway("migrate", "--config", str(config), cwd=tmp_path)).code == 0
    newer = f"{int(SCHEMA_REVISION) + 1:04d}"
    with sqlite3.connect(tmp_path / "data" / "gateway.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = ?", (newer,))
    conn.close()
    ran = await serve(config, cwd=tmp_path)
    assert ran.code == EXIT_CODES["database_schema"]
    assert ran.one_line() == (
        f"gateway: the database {tmp_path / 'data' / 'gateway.db'} is at schema {newer}, newer than this gateway's "
        f"{SCHEMA_REVISION} (gateway {installed_version()}): run the gateway version that wrote it (or restore a "
        "backup), or point database.url (GATEWAY_DATABASE_URL) at another database"
    )
    migrate = await gateway("migrate", "--config", str(config), cwd=tmp_path)
    assert migrate.code == EXIT_CODES["database_schema"] and f"is at schema {newer}, newer" in migrate.one_line()


async def test_migrate_backs_up_first_then_upgrades(tmp_path) -> None:
    from alembic import command

    config = write(tmp_path)
    path = tmp_path / "data" / "gateway.db"
    path.parent.mkdir()
    previous = f"{int(SCHEMA_REVISION) - 1:04d}"
    command.upgrade(store_db._alembic_config(f"sqlite:///{path}"), previous)  # the schema a release before
    ran = await gateway("migrate", "--config", str(config), cwd=tmp_path)
    (backup,) = path.parent.glob("gateway-*.db")
    assert ran.code == 0, ran.err
    assert ran.out.splitlines() == [
        f"backed up {path} (schema {previous}, gateway {installed_version()}) to {backup}",
        f"upgraded the database at {path} from schema {previous} to {SCHEMA_REVISION}",
    ]
    assert backup.name.startswith(f"gateway-{installed_version()}-rev{previous}-")
    up_to_date = await gateway("migrate", "--config", str(config), cwd=tmp_path)  # nothing to apply: no backup
    assert up_to_date.out.strip() == f"the database at {path} is up to date (schema {SCHEMA_REVISION})"
    assert len(list(path.parent.glob("gateway-*.db"))) == 1
