"""structlog set-up for every process (shell).

Shells bind `correlation_id` and `event_id` with `structlog.contextvars.bind_contextvars`; the
processors below add them to each line. The kernel binds more on its own: `trace_id` for every
RPC and every consumed event (`gyre.tracing`), and the task, execution and call ids a request or
an event payload names (`bind_ids`), so a service's log lines can be grepped by any of them.
"""

from __future__ import annotations

import logging
import sys

import structlog
from google.protobuf import descriptor, message

LOGGED_IDS = ("task_id", "execution_id", "call_id")


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
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
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
