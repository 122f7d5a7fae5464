"""structlog set-up for every process (shell).

Shells bind `correlation_id` and `event_id` with `structlog.contextvars.bind_contextvars`; the
processors below add them to each line. The kernel binds more on its own: `trace_id` for every
RPC and every consumed event (`gyre.tracing`), and the task, execution and call ids a request or
an event payload names (`bind_ids`), so a service's log lines can be grepped by any of them.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog
from google.protobuf import descriptor, message

LOGGED_IDS = ("task_id", "execution_id", "call_id")
SECRET_KEYS = frozenset({"token", "password", "secret", "authorization", "api_key", "x-api-key"})
_URL_PASSWORD = re.compile(r"(\b[a-z][a-z0-9+.-]*://[^:/@\s]+:)([^@\s]+)(@)", re.IGNORECASE)
_BEARER = re.compile(r"(\bBearer\s+)([^\s'\"]+)", re.IGNORECASE)


class _CurrentStderr:
    """`sys.stderr` as it is when a line is written, not when logging was configured: a caller
    that swaps stderr for a while (pytest's capture, a command run in-process) and closes it after
    must not leave every later line of the process writing to a closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(*, fmt: str = "console", level: str = "info") -> None:
    level_no = logging.getLevelNamesMapping()[level.upper()]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            redact_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )


def bind_ids(msg: message.Message) -> None:
    """Bind the ids in LOGGED_IDS that `msg` carries at its top level or in a singular sub-message
    (an `ExecutionRef`, say) to the logs of the current task.

    Example:
        bind_ids(ExecutionScheduled(execution=ExecutionRef(task_id="t1", execution_id="e1")))
        -> later lines carry task_id=t1 execution_id=e1
    """
    found: dict[str, str] = {}
    for field, value in msg.ListFields():
        if field.name in LOGGED_IDS and isinstance(value, str):
            found[field.name] = value
        elif field.type == descriptor.FieldDescriptor.TYPE_MESSAGE and not field.is_repeated:
            for inner, inner_value in value.ListFields():
                if inner.name in LOGGED_IDS and isinstance(inner_value, str):
                    found.setdefault(inner.name, inner_value)
    if found:
        structlog.contextvars.bind_contextvars(**found)


def redact(text: str) -> str:
    """Hide the password of a URL and a bearer token inside `text`.

    Example:
        redact("postgresql://postgres:hunter2@db:5432/gyre") -> "postgresql://postgres:***@db:5432/gyre"
    """
    return _BEARER.sub(r"\1***", _URL_PASSWORD.sub(r"\1***\3", text))


def redact_secrets(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: no log line carries a password or credential, whatever a caller passed
    (a URL with its password, an exception quoting one, a field named like a secret)."""
    for key, value in event.items():
        if key.lower() in SECRET_KEYS and value:
            event[key] = "***"
        elif isinstance(value, str) and ("://" in value or "earer" in value):
            event[key] = redact(value)
    return event
