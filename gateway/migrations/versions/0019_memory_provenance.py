"""Memory with provenance: who saved an entry, from what, who approved it; entry ids never reused

Each entry records where its words came from (`source`: the person's own words, or a
conversation that held a web page, a file, an attachment, an MCP or other tool's result, other
people's words), the name of who saved it and who approved a save from untrusted content.
Entries saved before this revision are `unknown` (shown as unverified). On SQLite the table is
rebuilt with AUTOINCREMENT, so a forgotten entry's number is never given to a new one (a
"forget N" read from an old listing cannot hit another entry); PostgreSQL's sequence never
reuses a number already.

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def _columns() -> list[sa.Column]:
    return [
        sa.Column("source", sa.String(64), nullable=False, server_default="unknown"),
        sa.Column("author_name", sa.String(255), nullable=True),
        sa.Column("approved_by", sa.String(128), nullable=True),
    ]


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        # A copy of the table with AUTOINCREMENT: SQLite otherwise hands out the highest
        # deleted rowid again.
        with op.batch_alter_table(
            "memories", recreate="always", table_kwargs={"sqlite_autoincrement": True}
        ) as batch:
            for column in _columns():
                batch.add_column(column)
        return
    for column in _columns():
        op.add_column("memories", column)


def downgrade() -> None:
    with op.batch_alter_table("memories") as batch:
        for name in ("approved_by", "author_name", "source"):
            batch.drop_column(name)
