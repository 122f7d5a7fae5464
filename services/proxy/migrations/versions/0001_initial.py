"""Execution tokens, engine routes, idempotent requests, outbox and inbox.

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
S = "proxy"


def upgrade() -> None:
    op.create_table(
        "execution_tokens",
        sa.Column("token_sha256", sa.LargeBinary, primary_key=True),
        sa.Column("execution_id", sa.Text, nullable=False, index=True),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )
    op.create_table(
        "engine_routes",
        sa.Column("engine_id", sa.Text, primary_key=True),
        sa.Column("cell_id", sa.Text, nullable=False),
        sa.Column("address", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )
    op.create_table(
        "rpc_requests",
        sa.Column("request_id", sa.Text, primary_key=True),
        sa.Column("method", sa.Text, nullable=False),
        sa.Column("fingerprint", sa.LargeBinary, nullable=False),
        sa.Column("response", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )
    create_kernel_tables(op.get_bind(), S)


def downgrade() -> None:
    for table in ("processed_messages", "outbox", "rpc_requests", "engine_routes", "execution_tokens"):
        op.drop_table(table, schema=S)
