"""Runs inside the grading sandbox: pytest with a reporter that writes to the host's pipe.

Started as `python -I -B grade_report.py <pytest args>` from a root-owned folder the sandbox user
cannot write. `-I` ignores PYTHON* variables and the user site, and the workspace joins
`sys.path` only after start-up, so a `sitecustomize.py`, `usercustomize.py` or `.pth` file in the
workspace is never run; `-B` writes no bytecode a later run could pick up. The reporter takes
the pipe's write end (GYRE_REPORT_FD) and keeps only a close-on-exec duplicate, so processes the
tested code starts do not inherit it. Records are JSON lines; the host judges them
(`services.evaluator.integrity`): code under test that writes its own lines, or patches pytest
into passing everything, is caught there, not here.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


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

    def pytest_runtest_logreport(self, report: Any) -> None:
        self._emit(kind="test", nodeid=report.nodeid, when=report.when, outcome=report.outcome)

    def pytest_sessionfinish(self, session: Any, exitstatus: int) -> None:
        self._emit(kind="end", exitstatus=int(exitstatus))


def main() -> int:
    fd = int(os.environ.pop("GYRE_REPORT_FD"))
    work = os.environ.pop("GYRE_WORK")
    import pytest  # before the workspace is on the path: a workspace `pytest.py` cannot shadow it

    plugin = PipeReport(fd)
    sys.path.insert(0, work)
    return int(pytest.main(sys.argv[1:], plugins=[plugin]))


if __name__ == "__main__":
    sys.exit(main())
