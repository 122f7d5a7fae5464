"""Steps keep the checksum of the samples they trained on and how to fetch them again.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
S = "trainer"


def upgrade() -> None:
    # Nullable: steps recorded before this revision have neither (GetStep reports them empty).
    op.add_column("steps", sa.Column("batch_sha256", sa.Text), schema=S)
    op.add_column("steps", sa.Column("batch_recipe", JSONB), schema=S)


def downgrade() -> None:
    op.drop_column("steps", "batch_recipe", schema=S)
    op.drop_column("steps", "batch_sha256", schema=S)
