"""Which holder of a thread recorded an outbox row (the lease and its fencing token)

A worker that takes a thread over delivers what an earlier holder left pending before its own
replies, so answers keep their order; the rows other threads' workers send into the same chat
(approval cards, job deliveries) carry their own lease and are left to their senders.

Revision ID: 0026
Revises: 0025
"""

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("outbox") as batch:
        batch.add_column(sa.Column("sender_lease", sa.String(255), nullable=True))
        batch.add_column(sa.Column("sender_fence", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("sender_fence")
        batch.drop_column("sender_lease")
