"""Rewards, idempotent requests, outbox and inbox.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from gyre.db.tables import create_kernel_tables

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
S = "evaluator"


def upgrade() -> None:
    op.create_table(
        "rewards",
        sa.Column("execution_id", sa.Uuid, primary_key=True),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("score", sa.Float, nullable=False),
        sa.Column("assessable", sa.Boolean, nullable=False),
        sa.Column("grade", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )
    op.create_table(
        "rpc_requests",
        sa.Column("request_id", sa.Text, primary_key=True),
        sa.Column("fingerprint", sa.LargeBinary, nullable=False),
        sa.Column("response", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )
    create_kernel_tables(op.get_bind(), S)


def downgrade() -> None:
    for table in ("processed_messages", "outbox", "rpc_requests", "rewards"):
        op.drop_table(table, schema=S)
