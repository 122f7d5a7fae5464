"""Replacements of infrastructure failures: a group's allowance, which member replaced which, and
whether the scheduler's decision about an unassessable member is known.

Groups stored before this revision allowed none (the rule they were submitted under), hence the
server default 0: they are ready as before, without waiting for any decision.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None
S = "trajectory"


def upgrade() -> None:
    op.add_column(
        "groups", sa.Column("max_infra_retries", sa.Integer, nullable=False, server_default="0"), schema=S
    )
    op.add_column("group_executions", sa.Column("replaces", sa.Uuid, nullable=True), schema=S)
    op.add_column(
        "group_executions",
        sa.Column("replacement_decided", sa.Boolean, nullable=False, server_default=sa.false()),
        schema=S,
    )


def downgrade() -> None:
    op.drop_column("group_executions", "replacement_decided", schema=S)
    op.drop_column("group_executions", "replaces", schema=S)
    op.drop_column("groups", "max_infra_retries", schema=S)
