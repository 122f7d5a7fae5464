"""Ready-group queue, steps, checkpoints, request ids, outbox and inbox.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

from gyre.db.tables import create_kernel_tables

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
S = "trainer"


def upgrade() -> None:
    # Spelled out, not imported from repo.py: a later change there must not rewrite this revision.
    op.create_table(
        "ready_groups",
        sa.Column("task_id", sa.Uuid, primary_key=True),
        sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False, unique=True),
        sa.Column("execution_ids", JSONB, nullable=False),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("consumed_version", sa.Integer),
        schema=S,
    )
    op.create_table(
        "steps",
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("task_ids", JSONB, nullable=False),
        sa.Column("checkpoint_uri", sa.Text, nullable=False),
        sa.Column("weights_uri", sa.Text, nullable=False),
        sa.Column("report", JSONB, nullable=False),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )
    op.create_table(
        "checkpoints",
        sa.Column("checkpoint_id", sa.Uuid, primary_key=True),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("uri", sa.Text, nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("saved_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )
    op.create_table(
        "rpc_requests",
        sa.Column("request_id", sa.Text, primary_key=True),
        sa.Column("method", sa.Text, nullable=False),
        sa.Column("fingerprint", sa.LargeBinary, nullable=False),
        sa.Column("response", sa.LargeBinary, nullable=False),
        schema=S,
    )
    create_kernel_tables(op.get_bind(), S)


def downgrade() -> None:
    for table in ("processed_messages", "outbox", "rpc_requests", "checkpoints", "steps", "ready_groups"):
        op.drop_table(table, schema=S)
