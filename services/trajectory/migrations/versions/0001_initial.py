"""Task groups and their executions, outbox and inbox.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from gyre.db.tables import create_kernel_tables

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
S = "trajectory"


def upgrade() -> None:
    op.create_table(
        "groups",
        sa.Column("task_id", sa.Uuid, primary_key=True),
        sa.Column("family", sa.Text, nullable=False),
        sa.Column("group_size", sa.Integer, nullable=False),
        sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("ready_at", sa.DateTime(timezone=True)),
        schema=S,
    )
    op.create_table(
        "group_executions",
        sa.Column("execution_id", sa.Uuid, primary_key=True),
        sa.Column("task_id", sa.Uuid, sa.ForeignKey(f"{S}.groups.task_id"), nullable=False),
        sa.Column("index_in_group", sa.Integer, nullable=False),
        sa.Column("reward", sa.Float),
        sa.UniqueConstraint("task_id", "index_in_group"),
        schema=S,
    )
    create_kernel_tables(op.get_bind(), S)


def downgrade() -> None:
    for table in ("processed_messages", "outbox", "group_executions", "groups"):
        op.drop_table(table, schema=S)
