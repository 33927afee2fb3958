"""full-text search over folded history

Revision ID: 0002
Revises: 0001

SQLite: an FTS5 table over compactions(summary, folded_text), kept in step by triggers.
PostgreSQL: a GIN index over the tsvector the history search queries with.
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_SQLITE_UP = [
    """CREATE VIRTUAL TABLE compactions_fts USING fts5(
        summary, folded_text, content='compactions', content_rowid='id', tokenize='porter unicode61')""",
    """CREATE TRIGGER compactions_fts_ai AFTER INSERT ON compactions BEGIN
        INSERT INTO compactions_fts(rowid, summary, folded_text) VALUES (new.id, new.summary, new.folded_text);
    END""",
    """CREATE TRIGGER compactions_fts_ad AFTER DELETE ON compactions BEGIN
        INSERT INTO compactions_fts(compactions_fts, rowid, summary, folded_text)
        VALUES ('delete', old.id, old.summary, old.folded_text);
    END""",
    """CREATE TRIGGER compactions_fts_au AFTER UPDATE ON compactions BEGIN
        INSERT INTO compactions_fts(compactions_fts, rowid, summary, folded_text)
        VALUES ('delete', old.id, old.summary, old.folded_text);
        INSERT INTO compactions_fts(rowid, summary, folded_text) VALUES (new.id, new.summary, new.folded_text);
    END""",
    "INSERT INTO compactions_fts(compactions_fts) VALUES ('rebuild')",
]
_SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS compactions_fts_au",
    "DROP TRIGGER IF EXISTS compactions_fts_ad",
    "DROP TRIGGER IF EXISTS compactions_fts_ai",
    "DROP TABLE IF EXISTS compactions_fts",
]
# Must stay identical to the expression in gateway/store/history.py.
_PG_UP = [
    """CREATE INDEX ix_compactions_search ON compactions
        USING GIN (to_tsvector('english'::regconfig, summary || ' ' || folded_text))""",
]
_PG_DOWN = ["DROP INDEX IF EXISTS ix_compactions_search"]


def _run(statements: list[str]) -> None:
    for statement in statements:
        op.execute(statement)


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        _run(_SQLITE_UP)
    elif dialect == "postgresql":
        _run(_PG_UP)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        _run(_SQLITE_DOWN)
    elif dialect == "postgresql":
        _run(_PG_DOWN)
