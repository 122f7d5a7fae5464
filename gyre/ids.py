"""Id types and generation (shell: reads the clock through UUIDv7).

Ids are UUIDv7 strings: time-ordered, so tables and the event log index them in insertion order.
"""

from __future__ import annotations

import uuid
from typing import NewType

import uuid6

TaskId = NewType("TaskId", str)
ExecutionId = NewType("ExecutionId", str)
EventId = NewType("EventId", str)
RequestId = NewType("RequestId", str)


def new_uuid7() -> str:
    return str(uuid6.uuid7())


def is_uuid(text: str) -> bool:
    """True for a canonical (lower-case, hyphenated) UUID string."""
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False
