"""Parse the test output of Go's and Rust's own runners, which SWE-smith's rows use (pure).

Example (`go test -v ./...`):
    --- PASS: TestAdd (0.00s)
        --- FAIL: TestSplit/empty (0.01s)
    --- SKIP: TestNet (0.00s)
    -> {"TestAdd": PASSED, "TestSplit/empty": FAILED, "TestNet": SKIPPED}

Example (`cargo test`):
    test parse::tests::empty ... ok
    test parse::tests::long ... FAILED
    test parse::tests::slow ... ignored, needs a day
    -> {"parse::tests::empty": PASSED, "parse::tests::long": FAILED, "parse::tests::slow": SKIPPED}
"""

from __future__ import annotations

import re

from services.evaluator.test_logs.status import TestStatus, plain_lines, record

_GO_RE = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+)(?: \([\d.]+m?s\))?$")
_GO = {"PASS": TestStatus.PASSED, "FAIL": TestStatus.FAILED, "SKIP": TestStatus.SKIPPED}
_CARGO_RE = re.compile(r"^test (.+) \.\.\. (ok|FAILED|ignored)(?:, .*)?$")
_CARGO = {"ok": TestStatus.PASSED, "FAILED": TestStatus.FAILED, "ignored": TestStatus.SKIPPED}


def parse_go_test(log: str) -> dict[str, TestStatus]:
    """Test name (subtests as `Parent/child`) -> status from `go test -v` output."""
    found: dict[str, TestStatus] = {}
    for line in plain_lines(log):
        match = _GO_RE.match(line)
        if match:
            record(found, match.group(2), _GO[match.group(1)])
    return found


def parse_cargo_test(log: str) -> dict[str, TestStatus]:
    """Test path -> status from `cargo test` output (doc-tests keep their `file - item (line N)` ids)."""
    found: dict[str, TestStatus] = {}
    for line in plain_lines(log):
        match = _CARGO_RE.match(line)
        if match:
            record(found, match.group(1), _CARGO[match.group(2)])
    return found
