"""An index of runs by stage: finding the running ones costs nothing per finished run

Revision ID: 0018
Revises: 0017
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_stage_id", "runs", ["stage", "id"])


def downgrade() -> None:
    op.drop_index("ix_runs_stage_id", table_name="runs")
