"""The request log takes the kernel's shape (`gyre.db.requests`): a `method` column.

Every row so far answered GradeWorkspace, the evaluator's only mutating RPC; ids and answers are kept.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
S = "evaluator"


def upgrade() -> None:
    op.add_column(
        "rpc_requests",
        sa.Column("method", sa.Text, nullable=False, server_default="GradeWorkspace"),
        schema=S,
    )
    op.alter_column("rpc_requests", "method", server_default=None, schema=S)


def downgrade() -> None:
    op.drop_column("rpc_requests", "method", schema=S)
