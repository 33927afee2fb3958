"""The migrations build exactly the schema the code declares, on both engines."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from gateway.store import migrations_current
from gateway.store.tables import include_object, metadata


async def test_migrated_schema_matches_the_tables(store):
    def diff(sync_conn):  # noqa: ANN001, ANN202
        context = MigrationContext.configure(sync_conn, opts={"compare_type": True, "include_object": include_object})
        return compare_metadata(context, metadata)

    differences = await store.db.read(diff)
    assert differences == []
    assert await migrations_current(store.db)
