"""Recorded calls' answers by (execution, call key), so a harness's retry gets the first answer.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None
S = "proxy"


def upgrade() -> None:
    op.create_table(
        "call_answers",
        sa.Column("execution_id", sa.Text, primary_key=True),
        sa.Column("call_key", sa.Text, primary_key=True),
        sa.Column("answer", sa.LargeBinary, nullable=False),
        sa.Column("delivered", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("call_answers", schema=S)
