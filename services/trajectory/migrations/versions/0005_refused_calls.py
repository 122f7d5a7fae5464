"""Calls refused for good (dead-lettered), so they count towards their execution's recorded calls.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None
S = "trajectory"


def upgrade() -> None:
    op.create_table(
        "refused_calls",
        sa.Column("call_id", sa.Text, primary_key=True),
        sa.Column("execution_id", sa.Text, nullable=False, index=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("refused_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("refused_calls", schema=S)
