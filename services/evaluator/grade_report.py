"""Runs inside the grading sandbox: pytest with a reporter that writes to the host's pipe.

Started as `python -I -B grade_report.py <pytest args>` from a root-owned folder the sandbox user
cannot write. `-I` ignores PYTHON* variables and the user site, and the workspace joins
`sys.path` only after start-up, so a `sitecustomize.py`, `usercustomize.py` or `.pth` file in the
workspace is never run; `-B` writes no bytecode a later run could pick up. The reporter takes
the pipe's write end (GYRE_REPORT_FD) and keeps only a close-on-exec duplicate, so processes the
tested code starts do not inherit it. Records are JSON lines; the host judges them
(`services.evaluator.integrity`): code under test that writes its own lines, or patches pytest
into passing everything, is caught there, not here.

A test returns the value under test; `plain` turns it into JSON by exact type (no method of an
object the solution made is called: a `list` subclass or an object with its own `__eq__` is
refused), and the host compares that text with the expected value it never sent here.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest

MAX_DEPTH = 32
MAX_VALUE_BYTES = 1 << 20


class NotPlain(TypeError):
    pass


def plain(value: Any, depth: int = 0) -> Any:
    """A copy made of exactly None, bool, int, float, str, list and dict with str keys (tuples
    become lists); anything else raises NotPlain."""
    if depth > MAX_DEPTH:
        raise NotPlain("the returned value is nested too deep")
    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if kind in (list, tuple):
        return [plain(v, depth + 1) for v in value]
    if kind is dict:
        if not all(type(k) is str for k in value):
            raise NotPlain("dict keys must be str")
        return {k: plain(v, depth + 1) for k, v in value.items()}
    raise NotPlain(f"a test returned a {kind.__name__}, not plain data")


class PipeReport:
    """pytest plugin: one JSON line per collection error and per test phase, then `end`."""

    def __init__(self, fd: int):
        self.fd = os.dup(fd)  # Python's dup is non-inheritable
        os.close(fd)

    def _emit(self, **record: Any) -> None:
        os.write(self.fd, (json.dumps(record) + "\n").encode())

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            self._emit(kind="collect", nodeid=report.nodeid, outcome="failed")

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: Any) -> bool:
        """Call the test and report the plain form of what it returned."""
        args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
        text = json.dumps(plain(pyfuncitem.obj(**args)))
        if len(text) > MAX_VALUE_BYTES:
            raise NotPlain("the returned value is too large")
        self._emit_raw(f'{{"kind": "value", "nodeid": {json.dumps(pyfuncitem.nodeid)}, "value": {text}}}')
        return True

    def _emit_raw(self, line: str) -> None:
        os.write(self.fd, (line + "\n").encode())

    def pytest_runtest_logreport(self, report: Any) -> None:
        self._emit(kind="test", nodeid=report.nodeid, when=report.when, outcome=report.outcome)

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        self._emit(kind="end", exitstatus=int(exitstatus))


def main() -> int:
    fd = int(os.environ.pop("GYRE_REPORT_FD"))
    work = os.environ.pop("GYRE_WORK")
    # pytest was imported above, before the workspace is on the path: a workspace `pytest.py`
    # cannot shadow it
    plugin = PipeReport(fd)
    plugin._emit(kind="start")  # the reporter ran: from here on, a silent end is the tested code's doing
    sys.path.insert(0, work)
    return int(pytest.main(sys.argv[1:], plugins=[plugin]))


if __name__ == "__main__":
    sys.exit(main())
