"""Test outcomes a log parser reports, and how two reports of one test combine (pure)."""

from __future__ import annotations

import enum
import re
from collections.abc import Callable

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class TestStatus(enum.StrEnum):
    """The outcome of one test id. Grading counts only PASSED as passed."""

    __test__ = False  # a dunder, so not a member: keeps pytest from collecting the enum

    PASSED = "PASSED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"


_SEVERITY = {TestStatus.PASSED: 0, TestStatus.SKIPPED: 1, TestStatus.FAILED: 2, TestStatus.ERROR: 3}

LogParser = Callable[[str], dict[str, TestStatus]]


def record(found: dict[str, TestStatus], test_id: str, status: TestStatus) -> None:
    """Keep the worse of two reports of one test.

    A runner may report one test twice (pytest's progress line and its summary line, or a
    test that passed and then errored in teardown); the failure must not be hidden by the pass.

    Example:
        {"t": PASSED} + ("t", ERROR) -> {"t": ERROR};  {"t": FAILED} + ("t", PASSED) -> {"t": FAILED}
    """
    test_id = test_id.strip()
    if not test_id:
        return
    old = found.get(test_id)
    if old is None or _SEVERITY[status] > _SEVERITY[old]:
        found[test_id] = status


def plain_lines(log: str) -> list[str]:
    """The log's lines without colour escapes or carriage-return progress (sphinx's runner adds them)."""
    return [ANSI_RE.sub("", line).rsplit("\r", 1)[-1].rstrip() for line in log.split("\n")]
