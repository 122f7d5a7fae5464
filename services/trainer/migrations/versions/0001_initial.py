"""Ready-group queue, steps, checkpoints, request ids, outbox and inbox.

Revision ID: 0001
Revises:
"""

from alembic import op

from gyre.db.tables import create_kernel_tables

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
S = "trainer"


def upgrade() -> None:
    from services.trainer.repo import checkpoints, ready_groups, rpc_requests, steps

    bind = op.get_bind()
    for table in (ready_groups, steps, checkpoints, rpc_requests):
        table.create(bind)
    create_kernel_tables(bind, S)


def downgrade() -> None:
    for table in ("processed_messages", "outbox", "rpc_requests", "checkpoints", "steps", "ready_groups"):
        op.drop_table(table, schema=S)
