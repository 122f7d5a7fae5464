"""Recorded calls per execution: the count RevokeExecutionToken answers.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None
S = "proxy"


def upgrade() -> None:
    op.create_table(
        "recorded_calls",
        sa.Column("execution_id", sa.Text, primary_key=True),
        sa.Column("num_calls", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("recorded_calls", schema=S)
