"""The one error root of Gyre, shared by every service (pure).

Services raise these; `gyre.rpc` maps them to gRPC status codes and the proxy's HTTP layer maps
them to each API's own error shape. Anything else escaping a handler is a bug and surfaces as
INTERNAL.
"""

from __future__ import annotations


class GyreError(Exception):
    """Base of every error a caller is meant to see."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFound(GyreError):
    """The named thing does not exist."""


class Conflict(GyreError):
    """The request contradicts the current state (e.g. a reused request_id with another body)."""


class Unavailable(GyreError):
    """A dependency is down or overloaded; retrying later may succeed."""


class InvalidArgument(GyreError):
    """The request is malformed; `field` names the offending field path.

    Example:
        InvalidArgument("tasks[2].group_size", "must be between 1 and 1024, got 0")
        -> str(): "tasks[2].group_size: must be between 1 and 1024, got 0"
    """

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem
