"""Parse sympy's `bin/test` output (pure).

In verbose mode (`bin/test -C --verbose`) each test is a line `test_name <verdict>` under its
file's line; ids are bare test names, as SWE-bench's sympy rows list them. Verdicts: `ok` passed,
`F` failed, `E` error, `f` failed as expected (passes), `X` passed though expected to fail (sympy
reports it, the run still passes), `s` / `w` skipped, `T` / `K` timed out or interrupted (fail).
A failure header `____ path.py:test_name ____` marks the test failed as well.

Example:
    sympy/core/tests/test_basic.py[3]
    test_equality ok
    test_atoms F
    test_slow s
    -> {"test_equality": PASSED, "test_atoms": FAILED, "test_slow": SKIPPED}
"""

from __future__ import annotations

import re

from services.evaluator.test_logs.status import TestStatus, plain_lines, record

_VERDICTS = {
    "ok": TestStatus.PASSED,
    "f": TestStatus.PASSED,
    "X": TestStatus.PASSED,
    "F": TestStatus.FAILED,
    "T": TestStatus.FAILED,
    "K": TestStatus.FAILED,
    "E": TestStatus.ERROR,
    "s": TestStatus.SKIPPED,
    "w": TestStatus.SKIPPED,
}
_LINE_RE = re.compile(r"^(test_\w+) +(ok|f|X|F|T|K|E|s|w)(?: .*)?$")
_HEADER_RE = re.compile(r"^_+ \S+\.py:(test_\w+) _+$")


def parse_sympy(log: str) -> dict[str, TestStatus]:
    """Test name -> status from sympy's test runner (see the module docstring)."""
    found: dict[str, TestStatus] = {}
    for line in plain_lines(log):
        line = line.strip()
        match = _LINE_RE.match(line)
        if match:
            record(found, match.group(1), _VERDICTS[match.group(2)])
            continue
        header = _HEADER_RE.match(line)
        if header:
            record(found, header.group(1), TestStatus.FAILED)
    return found
