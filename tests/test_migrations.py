"""The migrations build exactly the schema the code declares, on both engines."""

from __future__ import annotations

import asyncio
import sys

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from gateway.store import migrations_current
from gateway.store.db import SCHEMA_REVISION, current_revision, head_revision
from gateway.store.tables import include_object, metadata


async def test_migrated_schema_matches_the_tables(store):
    def diff(sync_conn):  # noqa: ANN001, ANN202
        context = MigrationContext.configure(sync_conn, opts={"compare_type": True, "include_object": include_object})
        return compare_metadata(context, metadata)

    differences = await store.db.read(diff)
    assert differences == []
    assert await migrations_current(store.db)


def test_the_schema_revision_constant_is_the_newest_migration():
    # A start checks the schema against this constant in one query; a new migration bumps it.
    assert SCHEMA_REVISION == head_revision(), "a new migration: set SCHEMA_REVISION in gateway/store/db.py to it"


async def test_an_empty_database_has_no_revision(tmp_path):
    from gateway.store import Store

    store = Store(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        assert await current_revision(store.db) is None
        assert not await migrations_current(store.db)
    finally:
        await store.close()


MIGRATE = "import asyncio, sys; from gateway.store import Store; asyncio.run(Store(sys.argv[1]).migrate())"


async def test_instances_migrating_one_database_at_once_all_start(database_url):
    """Instances of a deploy start together and each migrates its database: one applies the
    migrations, the others wait for it and find the schema current, none fails on its tables."""
    from gateway.store import Store

    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", MIGRATE, database_url, stderr=asyncio.subprocess.PIPE
        )
        for _ in range(3)
    ]
    outcomes = [(await process.wait(), (await process.stderr.read()).decode()) for process in processes]
    assert [code for code, _ in outcomes] == [0, 0, 0], [error[-600:] for _, error in outcomes]
    store = Store(database_url)
    try:
        assert await migrations_current(store.db)
    finally:
        await store.close()
