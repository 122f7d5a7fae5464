"""A mode set while a step runs waits for the step's end: the cluster's pending mode and the
SetMode request that asked for it.

Revision ID: 0003_cells
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_cells"
down_revision = "0002"
branch_labels = None
depends_on = None
S = "scheduler"


def upgrade() -> None:
    op.add_column("cluster", sa.Column("pending_mode", sa.Text, nullable=True), schema=S)
    op.add_column(
        "cluster", sa.Column("pending_request_id", sa.Text, nullable=False, server_default=""), schema=S
    )


def downgrade() -> None:
    op.drop_column("cluster", "pending_request_id", schema=S)
    op.drop_column("cluster", "pending_mode", schema=S)
