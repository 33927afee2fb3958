"""delegations: child agents linked to their parent run and tool call

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

from gateway.store.tables import Id, UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "delegations",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("parent_session_id", Id, nullable=False),
        sa.Column("parent_run_id", Id, nullable=True),
        sa.Column("parent_tool_call_id", Id, nullable=False),
        sa.Column("ordinal", sa.Integer(), nullable=False),
        sa.Column("thread_key", sa.String(255), nullable=False),
        sa.Column("child_session_id", Id, nullable=True),
        sa.Column("child_run_id", Id, nullable=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("tools", sa.JSON(), nullable=False),
        sa.Column("depth", sa.Integer(), nullable=False),
        sa.Column("background", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("reported", sa.Boolean(), nullable=False),
        sa.Column("created_at", UTCDateTime, nullable=False),
        sa.Column("finished_at", UTCDateTime, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_delegations"),
        sa.UniqueConstraint("child_session_id", name="uq_delegations_child_session_id"),
        sa.UniqueConstraint("parent_tool_call_id", "ordinal", name="uq_delegations_call_ordinal"),
    )
    op.create_index("ix_delegations_parent_session_id", "delegations", ["parent_session_id"])
    op.create_index("ix_delegations_parent_run_id", "delegations", ["parent_run_id"])
    op.create_index("ix_delegations_thread_key", "delegations", ["thread_key"])


def downgrade() -> None:
    op.drop_table("delegations")
