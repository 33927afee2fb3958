"""access (pairing requests, approved people and chats) and spend caps (counters, reservations)

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

from gateway.store.tables import UTCDateTime

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "access_requests",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("code", sa.String(16), nullable=False),
        sa.Column("token", sa.String(40), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(128), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("thread_key", sa.String(255), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("open_key", sa.String(200), nullable=True),
        sa.Column("prompts", sa.JSON(), nullable=False),
        sa.Column("decided_by", sa.String(64), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.Column("decided_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_access_requests"),
        sa.UniqueConstraint("code", name="uq_access_requests_code"),
        sa.UniqueConstraint("token", name="uq_access_requests_token"),
        sa.UniqueConstraint("open_key", name="uq_access_requests_open_key"),
    )
    op.create_index("ix_access_requests_channel_status", "access_requests", ["channel", "status"])
    op.create_table(
        "access_grants",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("channel", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(128), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("granted_by", sa.String(64), nullable=False),
        sa.Column("request_id", Id, nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_access_grants"),
        sa.UniqueConstraint("kind", "channel", "subject", name="uq_access_grants_kind_channel_subject"),
    )
    op.create_table(
        "budget_counters",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("period", sa.String(8), nullable=False),
        sa.Column("period_key", sa.String(16), nullable=False),
        sa.Column("used_nano_usd", sa.BigInteger(), nullable=False),
        sa.Column("reserved_nano_usd", sa.BigInteger(), nullable=False),
        sa.Column("used_tokens", sa.BigInteger(), nullable=False),
        sa.Column("reserved_tokens", sa.BigInteger(), nullable=False),
        sa.Column("alerted_permille", sa.Integer(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_budget_counters"),
        sa.UniqueConstraint("scope", "subject", "period", "period_key", name="uq_budget_counters_scope_subject_period_key"),
    )
    op.create_table(
        "budget_reservations",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("counters", sa.JSON(), nullable=False),
        sa.Column("nano_usd", sa.BigInteger(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_budget_reservations"),
        sqlite_autoincrement=True,
    )
    op.create_index("ix_budget_reservations_expires_at", "budget_reservations", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_budget_reservations_expires_at", table_name="budget_reservations")
    op.drop_table("budget_reservations")
    op.drop_table("budget_counters")
    op.drop_table("access_grants")
    op.drop_index("ix_access_requests_channel_status", table_name="access_requests")
    op.drop_table("access_requests")
