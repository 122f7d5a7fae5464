"""Cells (roles, addresses, heartbeats), the cluster's mode, version and observed costs, and the
lifecycle columns of tasks and executions (admission version, step, durations).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
S = "scheduler"


def upgrade() -> None:
    op.create_table(
        "cells",
        sa.Column("cell_id", sa.Text, primary_key=True),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("target_role", sa.Text, nullable=False, server_default=""),
        sa.Column("core", sa.Boolean, nullable=False),
        sa.Column("slots", sa.Integer, nullable=False),
        sa.Column("model_fingerprint", sa.Text, nullable=False),
        sa.Column("engine_id", sa.Text, nullable=False),
        sa.Column("engine_address", sa.Text, nullable=False),
        sa.Column("agent_address", sa.Text, nullable=False),
        sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
        schema=S,
    )
    # At most one core cell, enforced by the database as well as by RegisterCell.
    op.create_index(
        "cells_one_core", "cells", ["core"], unique=True, schema=S, postgresql_where=sa.text("core")
    )
    op.create_table(
        "cluster",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("mode", sa.Text, nullable=False),
        sa.Column("model_fingerprint", sa.Text, nullable=False, server_default=""),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("version_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("trained_groups", sa.Integer, nullable=False, server_default="0"),
        sa.Column("trained_tokens", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("training_cell_s", sa.Float, nullable=False, server_default="0"),
        sa.CheckConstraint("id = 1", name="cluster_single_row"),
        schema=S,
    )
    op.add_column("tasks", sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False), schema=S)
    op.add_column("tasks", sa.Column("admitted_version", sa.Integer, nullable=True), schema=S)
    op.add_column("tasks", sa.Column("assigned_step", sa.Integer, nullable=True), schema=S)
    op.add_column("tasks", sa.Column("trained_version", sa.Integer, nullable=True), schema=S)
    op.add_column("tasks", sa.Column("deadline", sa.DateTime(timezone=True), nullable=True), schema=S)
    op.add_column("executions", sa.Column("duration_s", sa.Float, nullable=True), schema=S)
    op.create_index("tasks_by_state", "tasks", ["state", "seq"], schema=S)


def downgrade() -> None:
    op.drop_index("tasks_by_state", table_name="tasks", schema=S)
    op.drop_column("executions", "duration_s", schema=S)
    for column in ("deadline", "trained_version", "assigned_step", "admitted_version", "seq"):
        op.drop_column("tasks", column, schema=S)
    op.drop_table("cluster", schema=S)
    op.drop_index("cells_one_core", table_name="cells", schema=S)
    op.drop_table("cells", schema=S)
