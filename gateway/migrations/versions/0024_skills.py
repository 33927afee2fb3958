"""Agent Skills pinned by content: each skill's files' SHA-256, its origin and its status

Revision ID: 0024
Revises: 0023
"""

import sqlalchemy as sa
from alembic import op

from gateway.store.tables import UTCDateTime

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "skills",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("origin", sa.String(1024), nullable=False),
        sa.Column("path", sa.String(1024), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("forced", sa.JSON(), nullable=True),
        sa.Column("approved_by", sa.String(160), nullable=True),
        sa.Column("added_at", UTCDateTime(), nullable=False),
        sa.Column("approved_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_skills"),
    )


def downgrade() -> None:
    op.drop_table("skills")
