"""flood waits shared by every instance

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

from gateway.store.tables import UTCDateTime

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chat_holds",
        sa.Column("chat", sa.String(255), nullable=False),
        sa.Column("until", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("chat", name="pk_chat_holds"),
    )


def downgrade() -> None:
    op.drop_table("chat_holds")
