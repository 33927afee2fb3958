"""outbox: when the platform asked to wait, and what was decided after an ambiguous send

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

import gateway.store.tables

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outbox") as batch_op:
        batch_op.add_column(sa.Column("retry_at", gateway.store.tables.UTCDateTime(), nullable=True))
        batch_op.add_column(sa.Column("uncertain", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox") as batch_op:
        batch_op.drop_column("uncertain")
        batch_op.drop_column("retry_at")
