"""Executions, idempotent requests, outbox and inbox.

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
S = "runner"


def upgrade() -> None:
    op.create_table(
        "executions",
        sa.Column("execution_id", sa.Uuid, primary_key=True),
        sa.Column("task_id", sa.Uuid, nullable=False),
        sa.Column("index_in_group", sa.Integer, nullable=False),
        sa.Column("request_id", sa.Text, nullable=False),
        sa.Column("harness", sa.Text, nullable=False),
        sa.Column("family", sa.Text, nullable=False),
        sa.Column("task", sa.Text, nullable=False),
        sa.Column("timeout_s", sa.Float, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("workspace_uri", sa.Text, nullable=False, server_default=""),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("deadline", sa.DateTime(timezone=True)),
        sa.Column("ended_at", sa.DateTime(timezone=True)),
        sa.Column("exit_code", sa.Integer),
        sa.Column("failure_kind", sa.Text, nullable=False, server_default=""),
        sa.Column("failure_reason", sa.Text, nullable=False, server_default=""),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )
    op.create_table(
        "rpc_requests",
        sa.Column("request_id", sa.Text, primary_key=True),
        sa.Column("method", sa.Text, nullable=False),
        sa.Column("fingerprint", sa.LargeBinary, nullable=False),
        sa.Column("execution_id", sa.Uuid, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )
    create_kernel_tables(op.get_bind(), S)


def downgrade() -> None:
    for table in ("processed_messages", "outbox", "rpc_requests", "executions"):
        op.drop_table(table, schema=S)
