"""The migrations build exactly the schema the code declares, on both engines."""

from __future__ import annotations

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
