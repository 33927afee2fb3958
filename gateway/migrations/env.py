"""Alembic environment: migrations run over the gateway's own connection (see store/db.py)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from gateway.store.tables import include_object, metadata

config = context.config


def _run(connection) -> None:  # noqa: ANN001
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
        include_object=include_object,
        on_version_apply=config.attributes.get("on_version_apply", ()),
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    # Offline tooling (autogenerate): a synchronous engine from the configured URL.
    url = config.get_main_option("sqlalchemy.url")
    assert url, "sqlalchemy.url is not set"
    url = url.replace("+aiosqlite", "").replace("+asyncpg", "+psycopg")
    with create_engine(url).connect() as sync_connection:
        _run(sync_connection)
        sync_connection.commit()
