"""Call log (append-only, normalised token blobs), execution headers, trajectories projection, rewards.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
S = "trajectory"


def upgrade() -> None:
    op.create_table(
        "executions",
        sa.Column("execution_id", sa.Text, primary_key=True),
        sa.Column("num_calls", sa.Integer, nullable=False, server_default="0"),
        sa.Column("num_unique_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("num_flat_tokens", sa.BigInteger, nullable=False, server_default="0"),
        schema=S,
    )
    op.create_table(
        "calls",
        sa.Column("execution_id", sa.Text, primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("call_id", sa.Text, nullable=False, unique=True),
        sa.Column("agent_role", sa.Text, nullable=False),
        sa.Column("agent_id", sa.Text, nullable=False),
        sa.Column("prompt_parent", sa.Integer, nullable=False),
        sa.Column("num_shared_prompt", sa.Integer, nullable=False),
        sa.Column("num_new_prompt", sa.Integer, nullable=False),
        sa.Column("output_parent", sa.Integer, nullable=False),
        sa.Column("num_shared_output", sa.Integer, nullable=False),
        sa.Column("num_output", sa.Integer, nullable=False),
        sa.Column("policy_version", sa.BigInteger, nullable=False),
        sa.Column("uniform_versions", sa.Boolean, nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("engine_id", sa.Text, nullable=False),
        sa.Column("num_migrations", sa.Integer, nullable=False),
        sa.Column("finish_reason", sa.Text, nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )
    # The payload is zlib-compressed already: store it out of line without a second compression.
    op.execute(f"ALTER TABLE {S}.calls ALTER COLUMN payload SET STORAGE EXTERNAL")
    op.create_table(
        "trajectories",
        sa.Column("execution_id", sa.Text, primary_key=True),
        sa.Column("chain_index", sa.Integer, primary_key=True),
        sa.Column("agent_role", sa.Text, nullable=False),
        sa.Column("agent_id", sa.Text, nullable=False),
        sa.Column("first_seq", sa.Integer, nullable=False),
        sa.Column("last_seq", sa.Integer, nullable=False),
        sa.Column("num_calls", sa.Integer, nullable=False),
        schema=S,
    )
    op.create_table(
        "rewards",
        sa.Column("execution_id", sa.Text, primary_key=True),
        sa.Column("task_id", sa.Text, nullable=False),
        sa.Column("reward", sa.Float, nullable=False),
        sa.Column("assessable", sa.Boolean, nullable=False),
        sa.Column("partial", sa.Boolean, nullable=False),
        sa.Column("assigned_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )


def downgrade() -> None:
    for table in ("rewards", "trajectories", "calls", "executions"):
        op.drop_table(table, schema=S)
