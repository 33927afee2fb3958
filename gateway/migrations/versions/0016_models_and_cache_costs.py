"""The model of a session and of a job (llm.models), and cache writes counted on runs

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("model", sa.String(64), nullable=True))
    op.add_column("schedules", sa.Column("model", sa.String(64), nullable=True))
    op.add_column("runs", sa.Column("cache_write_tokens", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("cache_write_tokens")
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("model")
    with op.batch_alter_table("sessions") as batch:
        batch.drop_column("model")
