"""Each execution token carries the oldest policy version its calls may be generated with.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None
S = "proxy"


def upgrade() -> None:
    op.add_column(
        "execution_tokens",
        sa.Column("min_policy_version", sa.BigInteger, nullable=False, server_default="0"),
        schema=S,
    )


def downgrade() -> None:
    op.drop_column("execution_tokens", "min_policy_version", schema=S)
