"""Cells (roles, addresses, heartbeats) and the cluster's mode and model fingerprint.

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
        sa.CheckConstraint("id = 1", name="cluster_single_row"),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("cluster", schema=S)
    op.drop_index("cells_one_core", table_name="cells", schema=S)
    op.drop_table("cells", schema=S)
