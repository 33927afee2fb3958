"""the audit trail

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

from gateway.store.tables import UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "audit",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("actor", sa.String(128), nullable=True),
        sa.Column("decided_by", sa.String(128), nullable=True),
        sa.Column("via", sa.String(16), nullable=True),
        sa.Column("tool", sa.String(128), nullable=True),
        sa.Column("thread_key", sa.String(255), nullable=True),
        sa.Column("run_id", Id, nullable=True),
        sa.Column("arguments", sa.JSON(), nullable=True),
        sa.Column("outcome", sa.String(32), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_audit_at", "audit", ["at"])
    op.create_index("ix_audit_actor_at", "audit", ["actor", "at"])
    op.create_index("ix_audit_tool_at", "audit", ["tool", "at"])


def downgrade() -> None:
    op.drop_index("ix_audit_tool_at", table_name="audit")
    op.drop_index("ix_audit_actor_at", table_name="audit")
    op.drop_index("ix_audit_at", table_name="audit")
    op.drop_table("audit")
