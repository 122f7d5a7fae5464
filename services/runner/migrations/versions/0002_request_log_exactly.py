"""The request log takes the kernel's shape (`gyre.db.requests`): a stored answer, not an execution id.

The runner's answers name the execution they are about (a repeat reports its state now), so an
old row's answer is `{Start,Cancel}ExecutionResponse(execution.execution.execution_id=...)`,
which both messages encode alike (field 1 > field 1 > field 2, a 36-character UUID), built here
in SQL. Ids, methods and fingerprints are kept.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
S = "runner"
# tag+length of: the response's `execution` (42 bytes), the Execution's `execution` (40) and the
# ExecutionRef's `execution_id` (36): 0x0a 0x28, 0x0a 0x26, 0x12 0x24.
PREFIX = "\\x0a280a261224"


def upgrade() -> None:
    op.add_column("rpc_requests", sa.Column("response", sa.LargeBinary), schema=S)
    op.execute(
        f"UPDATE {S}.rpc_requests SET response = '{PREFIX}'::bytea || convert_to(execution_id::text, 'UTF8')"
    )
    op.alter_column("rpc_requests", "response", nullable=False, schema=S)
    op.drop_column("rpc_requests", "execution_id", schema=S)


def downgrade() -> None:
    op.add_column("rpc_requests", sa.Column("execution_id", sa.Uuid), schema=S)
    op.execute(
        f"UPDATE {S}.rpc_requests SET execution_id = "
        f"convert_from(substring(response from 7 for 36), 'UTF8')::uuid"
    )
    op.alter_column("rpc_requests", "execution_id", nullable=False, schema=S)
    op.drop_column("rpc_requests", "response", schema=S)
