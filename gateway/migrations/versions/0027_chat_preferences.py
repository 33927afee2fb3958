"""A chat's own choices: `/voice on|off`

Revision ID: 0027
Revises: 0026
"""

import sqlalchemy as sa
from alembic import op

from gateway.store.tables import UTCDateTime

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chat_preferences",
        sa.Column("chat", sa.String(255), primary_key=True),
        sa.Column("voice", sa.Boolean(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("chat_preferences")
