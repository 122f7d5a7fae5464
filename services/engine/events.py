"""Publishing the engine's events on JetStream (shell).

The engine owns no tables, so there is no outbox: an event is published right after the change it
reports, with `Nats-Msg-Id = event_id` for dedupe. A publish that fails is logged and does not undo
the change (the engine's state is also visible through GetEngineStats).
"""

from __future__ import annotations

import structlog

from gyre.bus import Bus
from gyre.common.v1 import ids_pb2
from gyre.engine.v1 import events_pb2
from gyre.events import new_event
from services.engine.port import WeightsUpdate

log = structlog.get_logger(__name__)
PRODUCER = "engine"


class EnginePublisher:
    def __init__(self, bus: Bus | None, *, engine_id: str, cell_id: str) -> None:
        self.bus = bus
        self.engine_id = engine_id
        self.cell_id = cell_id

    async def weights_updated(self, request_id: str, update: WeightsUpdate, source_uri: str) -> None:
        await self._publish(
            events_pb2.EngineWeightsUpdated(
                engine_id=self.engine_id,
                cell_id=self.cell_id,
                previous_version=ids_pb2.PolicyVersion(steps=update.previous_version),
                version=ids_pb2.PolicyVersion(steps=update.version),
                source_uri=source_uri,
                duration_s=update.duration_s,
                request_id=request_id,
            ),
            causation_id=request_id,
        )

    async def drained(self, request_id: str, memory_released: bool, paused: tuple[str, ...]) -> None:
        await self._publish(
            events_pb2.EngineDrained(
                engine_id=self.engine_id,
                cell_id=self.cell_id,
                memory_released=memory_released,
                paused_request_ids=paused,
                request_id=request_id,
            ),
            causation_id=request_id,
        )

    async def _publish(
        self, payload: events_pb2.EngineWeightsUpdated | events_pb2.EngineDrained, *, causation_id: str
    ) -> None:
        if self.bus is None:
            return
        envelope = new_event(
            payload, producer=PRODUCER, correlation_id=self.cell_id, causation_id=causation_id
        )
        try:
            await self.bus.publish(envelope)
        except Exception:
            log.exception("engine_event_publish_failed", event_type=envelope.event_type)
