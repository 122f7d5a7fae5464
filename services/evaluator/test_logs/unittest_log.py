"""Parse unittest's verbose output, as Django's `runtests.py --verbosity 2` prints it (pure).

Ids are the text before " ... ": `test_name (module.Class)` (Python 3.11+ prints
`test_name (module.Class.test_name)`), or a docstring's first line when the test has one, which is
how Django rows of SWE-bench name such tests. A test that prints while it runs has its verdict on
a later line of its own; the `FAIL: id` / `ERROR: id` headers of the failure report count too.

Example:
    test_add (calc.tests.CalcTests) ... ok
    test_div (calc.tests.CalcTests) ... System check identified no issues (0 silenced).
    ok
    test_net (calc.tests.CalcTests) ... skipped 'no network'
    ERROR: test_io (calc.tests.CalcTests)
    -> {"test_add (calc.tests.CalcTests)": PASSED, "test_div (calc.tests.CalcTests)": PASSED,
        "test_net (calc.tests.CalcTests)": SKIPPED, "test_io (calc.tests.CalcTests)": ERROR}
"""

from __future__ import annotations

import re

from services.evaluator.test_logs.status import TestStatus, plain_lines, record

_SEP = " ... "
_HEADER_RE = re.compile(r"^(FAIL|ERROR): (.+)$")


def verdict(text: str) -> TestStatus | None:
    """The status a verdict word gives, or None when `text` is not one.

    Example: "ok" -> PASSED; "skipped 'slow'" -> SKIPPED; "expected failure" -> PASSED;
    "unexpected success" -> FAILED (unittest fails the run for it); "Creating table" -> None
    """
    text = text.strip()
    if text in ("ok", "OK"):
        return TestStatus.PASSED
    if text == "FAIL" or text == "unexpected success":
        return TestStatus.FAILED
    if text == "ERROR":
        return TestStatus.ERROR
    if text == "expected failure":
        return TestStatus.PASSED
    if text == "skipped" or text.startswith("skipped "):
        return TestStatus.SKIPPED
    return None


def parse_unittest(log: str) -> dict[str, TestStatus]:
    """Test id -> status from unittest / Django runner output (see the module docstring)."""
    found: dict[str, TestStatus] = {}
    pending: str | None = None  # a test whose line ended in output, not a verdict
    for line in plain_lines(log):
        header = _HEADER_RE.match(line)
        if header:
            failed = TestStatus.FAILED if header.group(1) == "FAIL" else TestStatus.ERROR
            record(found, header.group(2), failed)
            pending = None
            continue
        if _SEP in line:
            test_id, rest = line.split(_SEP, 1)
            status = verdict(rest)
            if status is not None:
                record(found, test_id, status)
                pending = None
            else:
                pending = test_id
            continue
        if pending is not None:
            status = verdict(line)
            if status is not None:
                record(found, pending, status)
                pending = None
    return found
