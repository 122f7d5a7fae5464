"""Executions cancelled before the runner took their ExecutionScheduled: never started.

Revision ID: 0003_cells
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_cells"
down_revision = "0002"
branch_labels = None
depends_on = None
S = "runner"


def upgrade() -> None:
    op.create_table(
        "cancelled_early",
        sa.Column("execution_id", sa.Uuid, primary_key=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("request_id", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("cancelled_early", schema=S)
