"""OAuth tokens of remote MCP servers, encrypted

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

from gateway.store.tables import UTCDateTime

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mcp_tokens",
        sa.Column("server", sa.String(64), nullable=False),
        sa.Column("tokens", sa.Text(), nullable=True),
        sa.Column("client", sa.Text(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("server", name="pk_mcp_tokens"),
    )


def downgrade() -> None:
    op.drop_table("mcp_tokens")
