"""Memory across sessions (entries per person, chat or job, sharing, DM sessions, a job's memory owner)

Tables: entries per person, chat or job; who shares theirs with groups; whether a session is
a direct message; whose memory a job made by the agent uses.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

from gateway.store.tables import Id, UTCDateTime

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memories",
        sa.Column("id", Id, autoincrement=True, nullable=False),
        sa.Column("owner", sa.String(160), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("topic", sa.String(64), nullable=True),
        sa.Column("created_by", sa.String(128), nullable=True),
        sa.Column("session_id", Id, nullable=True),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("last_used_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_memories"),
    )
    op.create_index("ix_memories_owner_last_used", "memories", ["owner", "last_used_at"])
    op.create_table(
        "memory_sharing",
        sa.Column("owner", sa.String(160), nullable=False),
        sa.Column("shared", sa.Boolean(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("owner", name="pk_memory_sharing"),
    )
    with op.batch_alter_table("sessions") as batch:
        batch.add_column(sa.Column("private", sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("memory_owner", sa.String(160), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("memory_owner")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("private")
    op.drop_table("memory_sharing")
    op.drop_index("ix_memories_owner_last_used", table_name="memories")
    op.drop_table("memories")
