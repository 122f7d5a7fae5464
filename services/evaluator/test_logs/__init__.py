"""Test-log parsers: a runner's output in, test id -> status out (pure, no I/O).

`parse_test_log("pytest", log)` picks a parser by the name a task's `[grading].log_parser`
gives. Grading (the evaluator's) counts a test absent from the parse, SKIPPED or ERROR as failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gyre.errors import InvalidArgument
from services.evaluator.test_logs.compiled_logs import parse_cargo_test, parse_go_test
from services.evaluator.test_logs.pytest_log import (
    parse_pytest,
    parse_pytest_matplotlib,
    parse_pytest_options,
    parse_pytest_r2e,
)
from services.evaluator.test_logs.status import LogParser, TestStatus
from services.evaluator.test_logs.sympy_log import parse_sympy
from services.evaluator.test_logs.unittest_log import parse_unittest

PARSERS: Mapping[str, LogParser] = MappingProxyType(
    {
        "pytest": parse_pytest,
        "pytest_options": parse_pytest_options,
        "matplotlib": parse_pytest_matplotlib,
        "r2e": parse_pytest_r2e,
        "django": parse_unittest,
        "unittest": parse_unittest,
        "sympy": parse_sympy,
        "go_test": parse_go_test,
        "cargo": parse_cargo_test,
    }
)


def parse_test_log(parser: str, log: str) -> dict[str, TestStatus]:
    """Test id -> status for `log` as the named runner prints it; an unknown name is refused."""
    chosen = PARSERS.get(parser)
    if chosen is None:
        raise InvalidArgument(
            "log_parser", f"unknown parser {parser!r}: expected one of {', '.join(PARSERS)}"
        )
    return chosen(log)


__all__ = ["PARSERS", "LogParser", "TestStatus", "parse_test_log"]
