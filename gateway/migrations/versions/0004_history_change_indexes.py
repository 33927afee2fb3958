"""index what the context builder asks every round: finished or open calls, failed rows

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_messages_session_status_seq", "messages", ["session_id", "status", "seq"])
    op.create_index("ix_tool_calls_session_finished", "tool_calls", ["session_id", "finished_at"])
    op.create_index("ix_tool_calls_session_status", "tool_calls", ["session_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_tool_calls_session_status", table_name="tool_calls")
    op.drop_index("ix_tool_calls_session_finished", table_name="tool_calls")
    op.drop_index("ix_messages_session_status_seq", table_name="messages")
