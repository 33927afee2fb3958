"""who asked for access, and whose requests a standing approval covers

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # the person behind a pairing request (a chat's: who addressed the bot): the cap counts people
    with op.batch_alter_table("access_requests") as batch:
        batch.add_column(sa.Column("asked_by", sa.String(128), nullable=True))
    # the person whose later requests a bypass covers (NULL: rows from before, the granter's own)
    with op.batch_alter_table("bypasses") as batch:
        batch.add_column(sa.Column("person", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("bypasses") as batch:
        batch.drop_column("person")
    with op.batch_alter_table("access_requests") as batch:
        batch.drop_column("asked_by")
