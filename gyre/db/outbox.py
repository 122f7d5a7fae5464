"""The transactional outbox and its relay to JetStream (shell).

A service writes its state and the events describing it in one transaction (`enqueue`), so an
event is never published for a rolled-back change nor lost for a committed one. The relay
publishes unpublished rows in order and marks them; JetStream's `Nats-Msg-Id` dedupe makes a
second publish after a crash between publish and mark harmless.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import sqlalchemy as sa
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from gyre.bus import Bus
from gyre.common.v1 import envelope_pb2
from gyre.metrics import OUTBOX_WAIT_SECONDS

log = structlog.get_logger(__name__)


async def enqueue(session: AsyncSession, outbox: sa.Table, *events: envelope_pb2.Envelope) -> None:
    if not events:
        return
    await session.execute(
        sa.insert(outbox),
        [
            {"event_id": uuid.UUID(e.event_id), "event_type": e.event_type, "envelope": e.SerializeToString()}
            for e in events
        ],
    )


class OutboxRelay:
    """Publishes a service's outbox; `poke()` after a commit for low latency, polling as a backstop."""

    def __init__(
        self, engine: AsyncEngine, bus: Bus, outbox: sa.Table, *, poll_s: float = 0.5, batch: int = 256
    ):
        self.engine = engine
        self.bus = bus
        self.outbox = outbox
        self.poll_s = poll_s
        self.batch = batch
        self._wake = asyncio.Event()
        self.published = 0

    def poke(self) -> None:
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                sent = await self.publish_pending()
            except Exception as exc:  # NATS or Postgres away: keep the rows, try again later
                log.warning("outbox_publish_failed", error=repr(exc))
                sent = 0
            if sent < self.batch:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self.poll_s)
                except TimeoutError:
                    pass

    async def publish_pending(self) -> int:
        """Publish one batch of unpublished events in order; returns how many were sent."""
        t = self.outbox
        async with self.engine.begin() as conn:
            rows = (
                await conn.execute(
                    sa.select(t.c.seq, t.c.envelope)
                    .where(t.c.published_at.is_(None))
                    .order_by(t.c.seq)
                    .limit(self.batch)
                    .with_for_update(skip_locked=True)
                )
            ).all()
            for row in rows:
                envelope = envelope_pb2.Envelope()
                envelope.ParseFromString(row.envelope)
                await self.bus.publish(envelope)
                waited_s = time.time() - envelope.occurred_at.ToNanoseconds() / 1e9
                OUTBOX_WAIT_SECONDS.labels(producer=envelope.producer).observe(max(0.0, waited_s))
            if rows:
                await conn.execute(
                    sa.update(t).where(t.c.seq.in_([r.seq for r in rows])).values(published_at=sa.func.now())
                )
        self.published += len(rows)
        return len(rows)
