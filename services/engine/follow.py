"""The engine follows the trainer: `WeightsPublished` -> the same path as `UpdateWeights` (shell).

Each engine has its own durable consumer (`engine-weights-<engine_id>`), so every engine sees
every version. The engine owns no tables, so idempotence comes from the version itself rather
than an inbox: a version at or below the loaded one is already applied (or superseded) and is
acked without work; a redelivery after a crash mid-update applies it once more, which loads the
same bytes. The update runs between decode iterations through `EngineBackend.update_weights`,
exactly as the RPC does, so in-flight generations continue on the new weights.

A restarted engine loads its initial weights, and its consumer has acked every version it saw
before: `catch_up` applies the latest published version (the last `WeightsPublished` on the
trainer's stream) before the engine serves, so it never serves stale weights after a restart.
"""

from __future__ import annotations

import re

import structlog
from nats.js.errors import NotFoundError

from gyre.bus import Bus
from gyre.consume import ConsumerSpec
from gyre.errors import Conflict
from gyre.events import DecodedEvent, parse_envelope, subject_for, type_map, unpack_payload
from gyre.trainer.v1 import events_pb2 as trainer_events
from services.engine.port import EngineBackend, EngineState

log = structlog.get_logger(__name__)


def durable_name(engine_id: str) -> str:
    """One durable consumer per engine; NATS names allow no dots, spaces or wildcards."""
    return "engine-weights-" + re.sub(r"[^A-Za-z0-9_-]", "_", engine_id)


class WeightsEvents:
    def __init__(self, backend: EngineBackend, *, engine_id: str) -> None:
        self.backend = backend
        self.engine_id = engine_id

    def spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable=durable_name(self.engine_id),
            producer="trainer",
            handlers={trainer_events.WeightsPublished: self.on_weights_published},
            batch=1,  # a version at a time: a later one in the same fetch supersedes nothing early
        )

    async def on_weights_published(self, event: DecodedEvent) -> None:
        await self.apply(event.payload, request_id=f"weights-published:{event.event_id}")

    async def apply(self, p: trainer_events.WeightsPublished, *, request_id: str) -> None:
        version = int(p.version.steps)
        stats = self.backend.stats()
        loaded = stats.policy_version
        if stats.state is EngineState.DRAINED:
            # Released for training: the cell's weights come back through UpdateWeights when the
            # scheduler returns it to rollout; loading them here would take the memory back.
            log.info("weights_skipped_while_drained", version=version, loaded=loaded)
            return
        if version <= loaded:
            log.info("weights_already_loaded", version=version, loaded=loaded)
            return
        try:
            update = await self.backend.update_weights(
                request_id=request_id, version=version, source_uri=p.source_uri, sha256=p.sha256
            )
        except Conflict as exc:  # a newer version arrived through UpdateWeights meanwhile
            log.info("weights_superseded", version=version, reason=str(exc))
            return
        log.info(
            "weights_followed",
            previous_version=update.previous_version,
            version=update.version,
            duration_s=round(update.duration_s, 4),
            continued=update.num_generations_continued,
        )

    async def catch_up(self, bus: Bus) -> int:
        """Apply the latest published weights, if newer than the loaded ones; the version served."""
        subject = subject_for(trainer_events.WeightsPublished.DESCRIPTOR.full_name, prefix=bus.prefix)
        try:
            msg = await bus.js.get_last_msg(await bus.ensure_stream("trainer"), subject)
        except NotFoundError:  # nothing published yet
            return self.backend.stats().policy_version
        envelope = parse_envelope(msg.data or b"")
        decoded = unpack_payload(
            envelope, await bus.load_payload(envelope), type_map([trainer_events.WeightsPublished])
        )
        if decoded is not None:
            log.info("weights_catch_up", latest=int(decoded.payload.version.steps))
            await self.apply(decoded.payload, request_id=f"weights-published:{envelope.event_id}")
        return self.backend.stats().policy_version
