"""Fuzzing a running gRPC service over the wire: requests built from its descriptors (test support).

`requests(method)` is a hypothesis strategy of raw request bodies for one method: messages whose
fields take wrong-looking but well-typed values (odd unicode, NUL, huge strings, negative and
extreme numbers, unknown enum values, nested messages, map entries), request ids drawn from a
small pool so that replays happen, plus bodies that are not protobuf at all and valid bodies cut
short. `call(channel, method, bodies)` sends them as raw bytes (client-streaming methods get the
bodies as a stream, a truncated one when the bodies are) and returns the status and details.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor, message_factory
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FD = descriptor.FieldDescriptor
RANDOM = os.environ.get("FUZZ_RANDOM") == "1"


def budget(default_examples: int) -> settings:
    """Hypothesis settings of a wire fuzz: derandomized in CI (the same examples every run), or
    FUZZ_RANDOM=1 for fresh ones; FUZZ_EXAMPLES overrides the number of examples."""
    return settings(
        max_examples=int(os.environ.get("FUZZ_EXAMPLES", default_examples)),
        deadline=None,
        database=None,
        derandomize=not RANDOM,
        suppress_health_check=list(HealthCheck),
    )


ODD_STRINGS = [
    "",
    "\x00",
    "a\x00b",
    "🙂" * 50,
    "\u202e\u0301\ufeff",
    "' OR 1=1; DROP TABLE tasks; --",
    "../../../../etc/passwd",
    "-1",
    "9" * 40,
    "x" * 100_000,
]
REQUEST_IDS = ["fuzz-1", "fuzz-2", "", "bad id with spaces", "r" * 200]
INT_RANGES = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
    FD.TYPE_FIXED64: (0, 2**64 - 1),
}
SQL_OR_INTERNALS = (
    "select ",
    "insert ",
    "update ",
    "delete from",
    "sqlalchemy",
    "asyncpg",
    "traceback",
    'file "',
)


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = [v for v in (0, 1, -1, lo, hi, 2**31 - 1, 2**31, -(2**31)) if lo <= v <= hi]
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def _scalar(field: FD) -> st.SearchStrategy[Any]:
    if field.type == FD.TYPE_STRING:
        if field.name == "request_id":
            return st.sampled_from(REQUEST_IDS)
        text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
        return st.one_of(st.sampled_from(ODD_STRINGS), text)
    if field.type == FD.TYPE_BYTES:
        return st.binary(max_size=64)
    if field.type == FD.TYPE_BOOL:
        return st.booleans()
    if field.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
        return st.floats(width=32 if field.type == FD.TYPE_FLOAT else 64)
    if field.type == FD.TYPE_ENUM:
        return st.integers(-2, 12)
    lo, hi = INT_RANGES[field.type]
    return _ints(lo, hi)


def _value(field: FD, depth: int) -> st.SearchStrategy[Any]:
    if field.type == FD.TYPE_MESSAGE:
        return _message(field.message_type, depth + 1)
    return _scalar(field)


@st.composite
def _message(draw: st.DrawFn, desc: descriptor.Descriptor, depth: int = 0) -> Any:
    msg = message_factory.GetMessageClass(desc)()
    if depth > 2:
        return msg
    for field in desc.fields:
        if not draw(st.booleans()):
            continue  # missing fields are part of the test
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field, value_field = (
                field.message_type.fields_by_name["key"],
                field.message_type.fields_by_name["value"],
            )
            for _ in range(draw(st.integers(0, 2))):
                key = draw(_scalar(key_field))
                if value_field.type == FD.TYPE_MESSAGE:
                    getattr(msg, field.name)[key].CopyFrom(
                        draw(_message(value_field.message_type, depth + 1))
                    )
                else:
                    getattr(msg, field.name)[key] = draw(_scalar(value_field))
        elif field.is_repeated:
            items = draw(st.lists(_value(field, depth), max_size=3))
            if field.type == FD.TYPE_MESSAGE:
                getattr(msg, field.name).extend(items)
            else:
                getattr(msg, field.name).extend(items)
        elif field.type == FD.TYPE_MESSAGE:
            getattr(msg, field.name).CopyFrom(draw(_message(field.message_type, depth + 1)))
        else:
            setattr(msg, field.name, draw(_scalar(field)))
    return msg


@st.composite
def _body(draw: st.DrawFn, desc: descriptor.Descriptor) -> bytes:
    kind = draw(st.sampled_from(["message", "message", "message", "garbage", "truncated"]))
    if kind == "garbage":
        return draw(st.binary(min_size=1, max_size=64))
    data = draw(_message(desc)).SerializeToString()
    if kind == "truncated" and len(data) > 1:
        return data[: draw(st.integers(1, len(data) - 1))]
    return data


def requests(method: descriptor.MethodDescriptor) -> st.SearchStrategy[list[bytes]]:
    """One body for a unary request; 0..3 (a truncated stream included) for a client stream."""
    if method.client_streaming:
        return st.lists(_body(method.input_type), max_size=3)
    return st.lists(_body(method.input_type), min_size=1, max_size=1)


@dataclass(frozen=True, slots=True)
class Answer:
    code: grpc.StatusCode
    details: str


def path_of(method: descriptor.MethodDescriptor) -> str:
    return f"/{method.containing_service.full_name}/{method.name}"


def call(
    channel: grpc.Channel, method: descriptor.MethodDescriptor, bodies: list[bytes], *, timeout_s: float
) -> Answer:
    """Send raw bodies; a response stream is read for at most 3 messages, then cancelled."""
    raw = {"request_serializer": None, "response_deserializer": None}
    path = path_of(method)
    try:
        if method.client_streaming and method.server_streaming:
            stream = channel.stream_stream(path, **raw)(iter(bodies), timeout=timeout_s)
            _drain(stream)
        elif method.client_streaming:
            channel.stream_unary(path, **raw)(iter(bodies), timeout=timeout_s)
        elif method.server_streaming:
            _drain(channel.unary_stream(path, **raw)(bodies[0], timeout=timeout_s))
        else:
            channel.unary_unary(path, **raw)(bodies[0], timeout=timeout_s)
    except grpc.RpcError as exc:
        return Answer(exc.code(), exc.details() or "")  # type: ignore[attr-defined]
    return Answer(grpc.StatusCode.OK, "")


def _drain(stream: Iterator[Any]) -> None:
    for i, _ in enumerate(stream):
        if i >= 2:
            stream.cancel()  # type: ignore[attr-defined]
            return


def leaks_internals(details: str) -> bool:
    lowered = details.lower()
    return any(marker in lowered for marker in SQL_OR_INTERNALS)
