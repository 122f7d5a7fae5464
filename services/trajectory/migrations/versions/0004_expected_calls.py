"""Rewards carry the number of calls the proxy recorded for the execution (NULL: not known).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None
S = "trajectory"


def upgrade() -> None:
    op.add_column("rewards", sa.Column("num_calls_expected", sa.Integer), schema=S)


def downgrade() -> None:
    op.drop_column("rewards", "num_calls_expected", schema=S)
