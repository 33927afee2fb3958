"""The owner's claim: a one-time code per chat channel with no admin, and wrong attempts per person

Revision ID: 0022
Revises: 0021
"""

import sqlalchemy as sa
from alembic import op

from gateway.store.tables import UTCDateTime

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "claim_codes",
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("code", sa.String(16), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("channel", name="pk_claim_codes"),
    )
    op.create_table(
        "claim_attempts",
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("person", sa.String(128), nullable=False),
        sa.Column("wrong", sa.Integer(), nullable=False),
        sa.Column("since", UTCDateTime(), nullable=False),
        sa.Column("locked_until", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("channel", "person", name="pk_claim_attempts"),
    )


def downgrade() -> None:
    op.drop_table("claim_attempts")
    op.drop_table("claim_codes")
