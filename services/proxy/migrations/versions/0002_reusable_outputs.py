"""Reusable outputs: the engine's ids for each assistant turn as the chat template renders it.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
S = "proxy"


def upgrade() -> None:
    op.create_table(
        "reusable_outputs",
        sa.Column("execution_id", sa.Text, primary_key=True),
        sa.Column("segment_sha256", sa.LargeBinary, primary_key=True),
        sa.Column("segment", sa.Text, nullable=False),
        sa.Column("gen_prefix", sa.Text, nullable=False),
        sa.Column("ids", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("reusable_outputs", schema=S)
