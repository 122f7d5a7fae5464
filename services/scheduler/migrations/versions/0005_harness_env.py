"""A task's harness_env: variables for the harness of each of its executions.

Tasks stored before this revision had none, hence the server default `{}`.

Revision ID: 0005_harness_env
Revises: 0004_infra_retries
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0005_harness_env"
down_revision = "0004_infra_retries"
branch_labels = None
depends_on = None
S = "scheduler"


def upgrade() -> None:
    op.add_column(
        "tasks",
        sa.Column("harness_env", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        schema=S,
    )


def downgrade() -> None:
    op.drop_column("tasks", "harness_env", schema=S)
