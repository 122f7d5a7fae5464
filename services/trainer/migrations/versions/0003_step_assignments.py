"""Which step each group belongs to, as the scheduler's policy assigned it (`StepAssigned`).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None
S = "trainer"


def upgrade() -> None:
    op.create_table(
        "step_assignments",
        sa.Column("task_id", sa.Uuid, primary_key=True),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False, unique=True),
        schema=S,
    )


def downgrade() -> None:
    op.drop_table("step_assignments", schema=S)
