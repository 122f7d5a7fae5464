"""structlog set-up for every process (shell).

Shells bind `correlation_id` and `event_id` with `structlog.contextvars.bind_contextvars`; the
processors below add them to each line.
"""

from __future__ import annotations

import logging
import sys

import structlog


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
