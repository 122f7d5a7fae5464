"""Infrastructure retries: a task's allowance, and which execution replaced which and why.

Tasks stored before this revision allowed none (the rule they were accepted under), hence the
server default 0 for existing rows; SubmitTasks always writes the value it used.

Revision ID: 0004_infra_retries
Revises: 0003_cells
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_infra_retries"
down_revision = "0003_cells"
branch_labels = None
depends_on = None
S = "scheduler"


def upgrade() -> None:
    op.add_column(
        "tasks", sa.Column("max_infra_retries", sa.Integer, nullable=False, server_default="0"), schema=S
    )
    op.add_column("executions", sa.Column("replaces", sa.Uuid, nullable=True), schema=S)
    op.add_column("executions", sa.Column("failure_reason", sa.Text, nullable=True), schema=S)
    # One replacement per failed execution, whatever redelivers its failure.
    op.create_unique_constraint("executions_replaces_key", "executions", ["replaces"], schema=S)


def downgrade() -> None:
    op.drop_constraint("executions_replaces_key", "executions", schema=S)
    op.drop_column("executions", "failure_reason", schema=S)
    op.drop_column("executions", "replaces", schema=S)
    op.drop_column("tasks", "max_infra_retries", schema=S)
