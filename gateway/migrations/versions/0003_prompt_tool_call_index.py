"""index prompts by tool call (the turn looks up the prompt of each open call)

Revision ID: 0003
Revises: 0002
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_prompts_tool_call_id", "prompts", ["tool_call_id"])


def downgrade() -> None:
    op.drop_index("ix_prompts_tool_call_id", table_name="prompts")
