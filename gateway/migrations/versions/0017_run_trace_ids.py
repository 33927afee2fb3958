"""runs.trace_id and runs.trace_span_id: the run's OpenTelemetry trace and its turn span

Revision ID: 0017
Revises: 0016
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("trace_id", sa.String(32), nullable=True))
    op.add_column("runs", sa.Column("trace_span_id", sa.String(16), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "trace_span_id")
    op.drop_column("runs", "trace_id")
