"""Ready groups count the steps tried with them, and keep why one was set aside.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None
S = "trainer"


def upgrade() -> None:
    op.add_column(
        "ready_groups", sa.Column("attempts", sa.Integer, nullable=False, server_default="0"), schema=S
    )
    op.add_column("ready_groups", sa.Column("last_error", sa.Text), schema=S)
    op.add_column("ready_groups", sa.Column("set_aside_at", sa.DateTime(timezone=True)), schema=S)


def downgrade() -> None:
    for column in ("set_aside_at", "last_error", "attempts"):
        op.drop_column("ready_groups", column, schema=S)
