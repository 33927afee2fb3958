"""the images sent with a user message, attached for the model while the turn is recent

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("messages", sa.Column("images", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("messages", "images")
