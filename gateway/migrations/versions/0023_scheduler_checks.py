"""Checks before the model: a job's check, checklist and idle backoff, its state, what a firing found

Revision ID: 0023
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

from gateway.store.tables import UTCDateTime

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("schedules") as batch:
        batch.add_column(sa.Column("check_spec", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("checklist", sa.String(255), nullable=True))
        batch.add_column(sa.Column("idle_max_every", sa.String(32), nullable=True))
        batch.add_column(sa.Column("check_failures_before_report", sa.Integer(), nullable=True))
    with op.batch_alter_table("job_runs") as batch:
        batch.add_column(sa.Column("check_result", sa.JSON(), nullable=True))
    id_type = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    op.create_table(
        "schedule_states",
        sa.Column("schedule_id", id_type, nullable=False),
        sa.Column("output_hash", sa.String(64), nullable=True),
        sa.Column("etag", sa.String(255), nullable=True),
        sa.Column("last_modified", sa.String(64), nullable=True),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("failure_reported", sa.Boolean(), nullable=False),
        sa.Column("checklist_hash", sa.String(64), nullable=True),
        sa.Column("backoff_s", sa.Integer(), nullable=True),
        sa.Column("last_woke_at", UTCDateTime(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["schedule_id"], ["schedules.id"], name="fk_schedule_states_schedule_id_schedules", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("schedule_id", name="pk_schedule_states"),
    )


def downgrade() -> None:
    op.drop_table("schedule_states")
    with op.batch_alter_table("job_runs") as batch:
        batch.drop_column("check_result")
    with op.batch_alter_table("schedules") as batch:
        batch.drop_column("check_failures_before_report")
        batch.drop_column("idle_max_every")
        batch.drop_column("checklist")
        batch.drop_column("check_spec")
