"""Parse pytest's output: the `-rA` summary and verbose progress lines (pure).

Ids are pytest node ids (`path::Class::test[params]`) exactly as printed, parameters with spaces
and brackets included. An id holding a space is also recorded cut at its first space: SWE-bench's
harness splits lines on whitespace, so the FAIL_TO_PASS / PASS_TO_PASS lists of its rows (and of
the datasets built with it) name such tests that way. XFAIL (failed as expected) and XPASS (a
non-strict expected failure that passed; strict ones print FAILED) count as PASSED, as pytest's
own exit status does.

Example:
    PASSED tests/test_a.py::test_x[a b]
    FAILED tests/test_a.py::test_y - AssertionError: 1 != 2
    tests/test_a.py::test_z ERROR                                  [ 75%]
    -> {"tests/test_a.py::test_x[a b]": PASSED, "tests/test_a.py::test_x[a": PASSED,
        "tests/test_a.py::test_y": FAILED, "tests/test_a.py::test_z": ERROR}
"""

from __future__ import annotations

import re

from services.evaluator.test_logs.status import TestStatus, plain_lines, record

WORDS = {
    "PASSED": TestStatus.PASSED,
    "FAILED": TestStatus.FAILED,
    "ERROR": TestStatus.ERROR,
    "SKIPPED": TestStatus.SKIPPED,
    "XFAIL": TestStatus.PASSED,
    "XPASS": TestStatus.PASSED,
}
_WORD = "|".join(WORDS)
# `-rA` summary: "WORD id", "WORD id - message", "WORD id reason" (XPASS before pytest 8).
_SUMMARY_RE = re.compile(rf"^({_WORD}) (\S.*)$")
# `-v` progress: "id WORD [ 42%]", "id SKIPPED (reason) [ 42%]" or "id WORD".
_PROGRESS_RE = re.compile(rf"^(\S.*?) ({_WORD})(?: \(.*\))?(?: +\[ *\d+%\])?$")
# Only a node id counts; "SKIPPED [1] tests/a.py:12: reason" names a line, not a test.
_NODE_RE = re.compile(r"^[^\s\[]+::")


def node_id(rest: str) -> str:
    """The node id at the start of a summary line's remainder.

    An id without parameters ends at the first space. With parameters it ends at the bracket
    that closes the first `[`, counting nested brackets; ids whose parameters hold an unbalanced
    bracket end at the last `]` before " - " (the message separator) or the end of the line.

    Example:
        "t.py::test[a b] - assert 0" -> "t.py::test[a b]"
        "t.py::test[x[1]]"           -> "t.py::test[x[1]]"
        "t.py::test_y - boom"        -> "t.py::test_y"
    """
    space = rest.find(" ")
    bracket = rest.find("[")
    if bracket < 0 or (0 <= space < bracket):
        return rest if space < 0 else rest[:space]
    depth = 0
    for i in range(bracket, len(rest)):
        if rest[i] == "[":
            depth += 1
        elif rest[i] == "]":
            depth -= 1
            if depth == 0 and (i + 1 == len(rest) or rest[i + 1] == " "):
                return rest[: i + 1]
    head = rest.split(" - ", 1)[0]
    close = head.rfind("]")
    return head[: close + 1] if close > bracket else head.split(" ", 1)[0]


def _record_node(found: dict[str, TestStatus], test_id: str, status: TestStatus) -> None:
    record(found, test_id, status)
    if " " in test_id:
        record(found, test_id.split(" ", 1)[0], status)


def parse_pytest(log: str) -> dict[str, TestStatus]:
    """Test id -> status from pytest output (see the module docstring)."""
    found: dict[str, TestStatus] = {}
    for line in plain_lines(log):
        summary = _SUMMARY_RE.match(line)
        if summary and _NODE_RE.match(summary.group(2)):
            _record_node(found, node_id(summary.group(2)), WORDS[summary.group(1)])
            continue
        progress = _PROGRESS_RE.match(line)
        if progress and _NODE_RE.match(progress.group(1)):
            _record_node(found, progress.group(1), WORDS[progress.group(2)])
    return found


_OPTION_RE = re.compile(r"^(.*?)\[(.*)\]$")


def parse_pytest_options(log: str) -> dict[str, TestStatus]:
    """pytest output whose parameters are absolute paths, kept as `[/<last part>]`.

    Tests parametrized by a temporary or installed path (requests, pylint, pydicom) print a
    different folder on every machine; SWE-bench's rows for them keep only the last part.

    Example: "PASSED t.py::test_load[/tmp/pytest-7/data/a.dcm]" -> {"t.py::test_load[/a.dcm]": PASSED}
    """
    found: dict[str, TestStatus] = {}
    for test_id, status in parse_pytest(log).items():
        match = _OPTION_RE.match(test_id)
        if match and match.group(2).startswith("/") and not match.group(2).startswith("//"):
            option = match.group(2)
            if "*" not in option:
                test_id = f"{match.group(1)}[/{option.rsplit('/', 1)[-1]}]"
        record(found, test_id, status)
    return found


def parse_pytest_matplotlib(log: str) -> dict[str, TestStatus]:
    """pytest output of matplotlib, whose rows name `MouseButton.LEFT` / `.RIGHT` parameters 1 / 3.

    Example: "PASSED t.py::test_click[MouseButton.LEFT]" -> {"t.py::test_click[1]": PASSED}
    """
    return parse_pytest(log.replace("MouseButton.LEFT", "1").replace("MouseButton.RIGHT", "3"))


def parse_pytest_r2e(log: str) -> dict[str, TestStatus]:
    """pytest output keyed the way R2E-Gym names tests: the node id without its file, `::` as `.`.

    Example: "PASSED r2e_tests/test_1.py::TestJoin::test_empty" -> {"TestJoin.test_empty": PASSED}
    """
    found: dict[str, TestStatus] = {}
    for test_id, status in parse_pytest(log).items():
        if "::" in test_id:
            record(found, ".".join(test_id.split("::")[1:]), status)
    return found
