"""Tree shape projection: where each call's new tokens hang in its execution tree.

Replay lays an execution's segments out from these rows instead of folding the call log again
(services/trajectory/layout.py). Rebuildable from the log: `gyre trajectory rebuild`.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None
S = "trajectory"


def upgrade() -> None:
    op.create_table(
        "tree_calls",
        sa.Column("execution_id", sa.Text, primary_key=True),
        sa.Column("seq", sa.Integer, primary_key=True),
        sa.Column("chain_index", sa.Integer, nullable=False),
        # Copies of the call log's counts, so laying out the shape reads this table alone.
        sa.Column("num_new_prompt", sa.Integer, nullable=False),
        sa.Column("num_new_output", sa.Integer, nullable=False),
        sa.Column("prompt_attach", sa.BigInteger, nullable=False),
        sa.Column("output_attach", sa.BigInteger, nullable=False),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("tree_calls", schema=S)
