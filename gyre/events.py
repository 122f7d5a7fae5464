"""The event envelope: building, naming and decoding events (pure, apart from `new_event`'s clock
and the trace context it copies from the caller).

Every fact travels as a `gyre.common.v1.Envelope` whose payload is a `google.protobuf.Any`.
The subject is derived from the payload's full name, so `gyre.scheduler.v1.TaskSubmitted` is
published on `<prefix>.scheduler.v1.TaskSubmitted` by the `scheduler` stream.

Example:
    env = new_event(TaskSubmitted(...), producer="scheduler", correlation_id=task_id)
    subject_of(env, prefix="gyre") -> "gyre.scheduler.v1.TaskSubmitted"
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any as AnyType

from google.protobuf import any_pb2, message
from google.protobuf.message import DecodeError

from gyre.common.v1 import envelope_pb2
from gyre.ids import new_uuid7
from gyre.tracing import current_carrier

Envelope = envelope_pb2.Envelope
ROOT_PACKAGE = "gyre"


class UndecodableEvent(Exception):
    """A message that can never be decoded, whatever the number of retries."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodedEvent:
    """An envelope with its payload unpacked into its generated message class."""

    envelope: envelope_pb2.Envelope
    payload: AnyType  # a generated protobuf message; typed per handler

    @property
    def event_id(self) -> str:
        return self.envelope.event_id


def new_event(
    payload: message.Message,
    *,
    producer: str,
    correlation_id: str,
    causation_id: str = "",
    occurred_at: datetime | None = None,
    event_id: str | None = None,
) -> envelope_pb2.Envelope:
    env = envelope_pb2.Envelope(
        event_id=event_id or new_uuid7(),
        event_type=payload.DESCRIPTOR.full_name,
        producer=producer,
        correlation_id=correlation_id,
        causation_id=causation_id,
    )
    env.occurred_at.FromDatetime(occurred_at or datetime.now(UTC))
    env.payload.Pack(payload)
    env.trace_context.update(current_carrier())
    return env


def event_name_parts(event_type: str) -> tuple[str, str, str]:
    """Split `gyre.<service>.<version>.<Name>` into (service, version, Name).

    Example:
        event_name_parts("gyre.scheduler.v1.TaskSubmitted") -> ("scheduler", "v1", "TaskSubmitted")
    """
    parts = event_type.split(".")
    if len(parts) != 4 or parts[0] != ROOT_PACKAGE or not parts[3][:1].isupper():
        raise ValueError(f"event type {event_type!r} is not of the form gyre.<service>.<version>.<EventName>")
    return parts[1], parts[2], parts[3]


def subject_for(event_type: str, *, prefix: str) -> str:
    service, version, name = event_name_parts(event_type)
    return f"{prefix}.{service}.{version}.{name}"


def subject_of(envelope: envelope_pb2.Envelope, *, prefix: str) -> str:
    return subject_for(envelope.event_type, prefix=prefix)


def stream_name(service: str, *, prefix: str) -> str:
    """JetStream stream of one producing service: `GYRE_SCHEDULER` for prefix `gyre`."""
    return f"{prefix}_{service}".upper().replace(".", "_").replace("-", "_")


def service_subjects(service: str, *, prefix: str) -> str:
    return f"{prefix}.{service}.*.*"


def parse_envelope(data: bytes) -> envelope_pb2.Envelope:
    env = envelope_pb2.Envelope()
    try:
        env.ParseFromString(data)
    except DecodeError as exc:
        raise UndecodableEvent(f"envelope is not a gyre.common.v1.Envelope: {exc}") from exc
    if not env.event_id or not env.event_type:
        raise UndecodableEvent("envelope lacks event_id or event_type")
    return env


def unpack_payload(
    env: envelope_pb2.Envelope, payload_any: any_pb2.Any, types: Mapping[str, type[message.Message]]
) -> DecodedEvent | None:
    """Unpack the payload into its class; None when this consumer has no handler for the type."""
    cls = types.get(env.event_type)
    if cls is None:
        return None
    if not payload_any.TypeName() == cls.DESCRIPTOR.full_name:
        raise UndecodableEvent(
            f"payload type {payload_any.type_url!r} does not match event_type {env.event_type!r}"
        )
    payload = cls()
    try:
        payload_any.Unpack(payload)
    except DecodeError as exc:
        raise UndecodableEvent(f"payload is not a valid {env.event_type}: {exc}") from exc
    return DecodedEvent(envelope=env, payload=payload)


def type_map(classes: Iterable[type[message.Message]]) -> dict[str, type[message.Message]]:
    return {cls.DESCRIPTOR.full_name: cls for cls in classes}
