"""Tables every service schema has: the outbox and the processed-messages inbox (declarations, no I/O)."""

from __future__ import annotations

import sqlalchemy as sa


def outbox_table(metadata: sa.MetaData) -> sa.Table:
    """Events written in the same transaction as the state they describe, published by the relay."""
    return sa.Table(
        "outbox",
        metadata,
        sa.Column("seq", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("event_id", sa.Uuid, nullable=False, unique=True),
        sa.Column("event_type", sa.Text, nullable=False),
        sa.Column("envelope", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.Column("published_at", sa.DateTime(timezone=True)),
        sa.Index("outbox_unpublished", "seq", postgresql_where=sa.text("published_at IS NULL")),
    )


def processed_messages_table(metadata: sa.MetaData) -> sa.Table:
    """(consumer, event_id) pairs already applied: redelivery becomes a no-op."""
    return sa.Table(
        "processed_messages",
        metadata,
        sa.Column("consumer", sa.Text, primary_key=True),
        sa.Column("event_id", sa.Uuid, primary_key=True),
        sa.Column("processed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )


def create_kernel_tables(bind: sa.Connection, schema: str) -> None:
    """Create both tables in a service's first migration (`bind` is `op.get_bind()`)."""
    metadata = sa.MetaData(schema=schema)
    outbox_table(metadata)
    processed_messages_table(metadata)
    metadata.create_all(bind)
