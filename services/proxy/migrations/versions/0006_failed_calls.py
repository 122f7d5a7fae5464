"""Model calls the proxy failed per execution: the count RevokeExecutionToken answers beside the
recorded calls, so the runner can tell an engine outage from the policy's own crash.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None
S = "proxy"


def upgrade() -> None:
    op.create_table(
        "failed_calls",
        sa.Column("execution_id", sa.Text, primary_key=True),
        sa.Column("num_calls", sa.Integer, nullable=False),
        sa.Column("last_message", sa.Text, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("failed_calls", schema=S)
