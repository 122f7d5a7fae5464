"""The JetStream event bus: streams, deduplicated publishing, large payloads (shell).

One stream per producing service (`GYRE_SCHEDULER` holds `gyre.scheduler.*.*`), a dead-letter
stream for messages a consumer gave up on, and an object-store bucket for payloads too large
for one message. Publishing sets `Nats-Msg-Id` to the event id, so a republished event (the
outbox relay after a crash, say) is stored once within the stream's duplicate window.

Every stream and the payload bucket have retention limits (`max_age_s`, and `max_bytes` per
stream when set, oldest discarded first): Postgres is the durable record (each producer's outbox, the
trajectory service's call log); the bus only carries events to their consumers. A consumer
down for longer than `max_age_s` misses what expired meanwhile.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime

import nats
from google.protobuf import any_pb2
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    ObjectStoreConfig,
    PubAck,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError, ObjectNotFoundError
from nats.js.object_store import ObjectStore

from gyre.common.v1 import envelope_pb2
from gyre.events import UndecodableEvent, service_subjects, stream_name, subject_of
from gyre.metrics import DEAD_LETTERS, EVENTS_PUBLISHED, observe_published
from gyre.settings import DEFAULT_MAX_AGE_S, DEFAULT_MAX_BYTES

DEAD_LETTER_SERVICE = "deadletter"
DUPLICATE_WINDOW_S = 24 * 3600  # a relay republishing after a day-long outage is still deduplicated
HEADER_MARGIN_BYTES = 4096  # headers and protocol framing on top of the envelope
REASON_HEADER = "Gyre-Dead-Letter-Reason"


@dataclass(frozen=True, slots=True, kw_only=True)
class BusConfig:
    url: str
    prefix: str = "gyre"
    inline_limit_bytes: int | None = None
    """Envelopes above this go through the object store; None: the server's max payload."""
    max_age_s: float = DEFAULT_MAX_AGE_S
    """How long a stream keeps a message (and the bucket a payload)."""
    max_bytes: int = DEFAULT_MAX_BYTES
    """Most bytes one stream (or the payload bucket) holds, the oldest messages going first; 0:
    no byte limit (JetStream reserves max_bytes against the server's storage up front)."""


class Bus:
    """A connected JetStream context with Gyre's naming rules."""

    def __init__(self, nc: NatsClient, config: BusConfig) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.prefix = config.prefix
        server_limit = nc.max_payload - HEADER_MARGIN_BYTES
        self.inline_limit_bytes = min(config.inline_limit_bytes or server_limit, server_limit)
        self._ensured_streams: set[str] = set()
        self.max_age_s = config.max_age_s
        self.max_bytes = config.max_bytes

    @classmethod
    async def connect(cls, config: BusConfig, *, name: str = "gyre") -> Bus:
        nc = await nats.connect(
            config.url, name=name, connect_timeout=5, max_reconnect_attempts=60, reconnect_time_wait=1
        )
        # Once connected, reconnect for as long as the server is away: a client that gave up after
        # a minute would leave its service up but deaf after a longer NATS restart. (The first
        # connect keeps its bound, so a command started with NATS down still ends; nats-py reads
        # this option at each reconnect.)
        nc.options["max_reconnect_attempts"] = -1
        return cls(nc, config)

    async def close(self) -> None:
        await self.nc.drain()

    @property
    def payload_bucket(self) -> str:
        return f"{self.prefix}-payloads"

    async def ensure_stream(self, service: str) -> str:
        """Create (or keep) the stream of one producing service; returns its name."""
        name = stream_name(service, prefix=self.prefix)
        if name in self._ensured_streams:
            return name
        config = StreamConfig(
            name=name,
            subjects=[service_subjects(service, prefix=self.prefix)],
            storage=StorageType.FILE,
            duplicate_window=min(DUPLICATE_WINDOW_S, self.max_age_s),
            retention=RetentionPolicy.LIMITS,
            discard=DiscardPolicy.OLD,
            max_age=self.max_age_s,
            max_bytes=self.max_bytes or -1,
        )
        try:
            await self.js.add_stream(config)
        except BadRequestError:
            # Exists with another config (an older version of Gyre): bring it up to date.
            await self.js.update_stream(config)
        self._ensured_streams.add(name)
        return name

    async def publish(self, envelope: envelope_pb2.Envelope) -> PubAck:
        """Publish one event; large payloads move to the object store first."""
        await self.ensure_stream(envelope.producer)
        data = envelope.SerializeToString()
        if len(data) > self.inline_limit_bytes:
            data = (await self._offload_payload(envelope)).SerializeToString()
        ack = await self.js.publish(
            subject_of(envelope, prefix=self.prefix),
            data,
            # The producer's trace context rides in the headers (W3C names), where consumers read it.
            headers={"Nats-Msg-Id": envelope.event_id, **envelope.trace_context},
        )
        EVENTS_PUBLISHED.labels(event_type=envelope.event_type).inc()
        observe_published(envelope)
        return ack

    async def _offload_payload(self, envelope: envelope_pb2.Envelope) -> envelope_pb2.Envelope:
        blob = envelope.payload.SerializeToString()
        store = await self._payload_store()
        await store.put(envelope.event_id, blob)
        slim = envelope_pb2.Envelope()
        slim.CopyFrom(envelope)
        slim.payload_ref.bucket = self.payload_bucket
        slim.payload_ref.object_name = envelope.event_id
        slim.payload_ref.size_bytes = len(blob)
        slim.payload_ref.sha256 = hashlib.sha256(blob).hexdigest()
        return slim

    async def _payload_store(self) -> ObjectStore:
        try:
            return await self.js.object_store(self.payload_bucket)
        except BucketNotFoundError:
            return await self.js.create_object_store(
                self.payload_bucket,
                config=ObjectStoreConfig(ttl=self.max_age_s, max_bytes=self.max_bytes or -1),
            )

    async def load_payload(self, envelope: envelope_pb2.Envelope) -> any_pb2.Any:
        """The envelope's payload, fetched from the object store when it was offloaded."""
        if envelope.WhichOneof("body") == "payload":
            return envelope.payload
        if envelope.WhichOneof("body") != "payload_ref":
            raise UndecodableEvent(f"event {envelope.event_id} has no payload")
        ref = envelope.payload_ref
        try:
            store = await self.js.object_store(ref.bucket)
            blob = (await store.get(ref.object_name)).data or b""
        except (BucketNotFoundError, ObjectNotFoundError, NotFoundError) as exc:
            raise UndecodableEvent(f"offloaded payload {ref.bucket}/{ref.object_name} is missing") from exc
        if hashlib.sha256(blob).hexdigest() != ref.sha256:
            raise UndecodableEvent(f"offloaded payload {ref.bucket}/{ref.object_name} fails its checksum")
        payload = any_pb2.Any()
        payload.ParseFromString(blob)
        return payload

    async def dead_letter(self, msg: Msg, *, consumer: str, reason: str) -> None:
        """Park a message that can never be processed, with the reason, on the dead-letter stream."""
        await self.ensure_stream(DEAD_LETTER_SERVICE)
        meta = msg.metadata
        record = envelope_pb2.DeadLetter(
            consumer=consumer,
            subject=msg.subject,
            stream_sequence=meta.sequence.stream,
            msg_id=(msg.headers or {}).get("Nats-Msg-Id", ""),
            reason=reason,
            num_delivered=meta.num_delivered,
            data=msg.data,
        )
        record.dead_lettered_at.FromDatetime(datetime.now(UTC))
        await self.js.publish(
            dead_letter_subject(consumer, prefix=self.prefix),
            record.SerializeToString(),
            headers={
                # One dead letter per (consumer, original message), however often we get here.
                "Nats-Msg-Id": f"dl:{consumer}:{meta.stream}:{meta.sequence.stream}",
                REASON_HEADER: reason[:512].replace("\r", " ").replace("\n", " "),
            },
        )
        DEAD_LETTERS.labels(consumer=consumer).inc()


def dead_letter_subject(consumer: str, *, prefix: str) -> str:
    return f"{prefix}.{DEAD_LETTER_SERVICE}.v1.{consumer}"
