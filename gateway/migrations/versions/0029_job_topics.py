"""A job's topic of its own: its name on the schedule, the thread it opened in its state

Revision ID: 0029
Revises: 0028
"""

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("topic", sa.String(128), nullable=True))
    with op.batch_alter_table("schedule_states") as batch:
        batch.add_column(sa.Column("topic_thread", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("schedule_states") as batch:
        batch.drop_column("topic_thread")
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("topic")
