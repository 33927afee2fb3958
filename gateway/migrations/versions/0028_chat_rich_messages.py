"""A chat's own choice of Telegram rich messages: `/rich on|off`

Revision ID: 0028
Revises: 0027
"""

import sqlalchemy as sa
from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("chat_preferences") as batch:
        batch.add_column(sa.Column("rich", sa.Boolean(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("chat_preferences") as batch:
        batch.drop_column("rich")
