"""Id types and generation (shell: reads the clock through UUIDv7).

Ids are UUIDv7 strings: time-ordered, so tables and the event log index them in insertion order.
"""

from __future__ import annotations

import re
import uuid
from typing import NewType

import uuid6

from gyre.errors import InvalidArgument

TaskId = NewType("TaskId", str)
ExecutionId = NewType("ExecutionId", str)
EventId = NewType("EventId", str)
RequestId = NewType("RequestId", str)

REQUEST_ID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


def new_uuid7() -> str:
    return str(uuid6.uuid7())


def require_uuid(field: str, text: str, *, what: str) -> str:
    """Return `text` if it is a canonical UUID, else InvalidArgument naming the field."""
    if not is_uuid(text):
        raise InvalidArgument(field, f"must be {what} id (UUID), got {text!r}")
    return text


def is_uuid(text: str) -> bool:
    """True for a canonical (lower-case, hyphenated) UUID string."""
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False


def validate_request_id(request_id: str, field: str = "request_id") -> str:
    """InvalidArgument naming `field` unless `request_id` is a usable client-chosen idempotency key."""
    if not request_id:
        raise InvalidArgument(field, "is required: a client-chosen idempotency key")
    if not REQUEST_ID_RE.fullmatch(request_id):
        raise InvalidArgument(field, f"must be 1..128 characters of [A-Za-z0-9_.:-], got {request_id[:64]!r}")
    return request_id
