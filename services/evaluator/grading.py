"""Grade a workspace inside a sandbox, never outside it (shell: sandboxes, files, processes).

The workspace is copied (regular files, folders and links only: no fifo can block the copy)
into a fresh sandbox with its own user, quota and no network; the hidden tests or check script
go next to it; the grader runs there under a deadline. A crash is retried; a hang is killed at
the deadline and reported as such; neither touches the preserved workspace.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import structlog

from gyre.errors import InvalidArgument
from gyre.sandbox.host import Sandbox, SandboxHost
from gyre.sandbox.limits import MIB, SandboxLimits
from services.evaluator.scoring import (
    ERRORED,
    FAILED,
    PASSED,
    SKIPPED,
    GraderRun,
    Scored,
    not_assessable,
    parse_verdicts,
    score_task,
)
from services.evaluator.taskset import TaskDef

log = structlog.get_logger(__name__)
HIDDEN_DIR = "gyre_hidden"
GRADER_VERSION = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Graded:
    scored: Scored
    grader: str
    duration_s: float
    attempts: int


class CopyTooLarge(Exception):
    pass


def safe_copy(src: Path, dest: Path, *, budget_bytes: int) -> int:
    """Copy folders, regular files and symlinks (as links) from src into dest; bytes copied."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        rel = Path(dirpath).relative_to(src)
        (dest / rel).mkdir(parents=True, exist_ok=True)
        for name in dirnames + filenames:
            s = Path(dirpath) / name
            d = dest / rel / name
            st = s.lstat()
            if os.path.islink(s):
                os.symlink(os.readlink(s), d)
            elif name in filenames and s.is_file():
                total += st.st_size
                if total > budget_bytes:
                    raise CopyTooLarge(f"workspace holds more than {budget_bytes // MIB} MiB")
                shutil.copyfile(s, d, follow_symlinks=False)
                os.chmod(d, st.st_mode & 0o777)
    return total


class Grader:
    def __init__(self, host: SandboxHost, limits: SandboxLimits, *, attempts: int = 3):
        self.host = host
        self.limits = limits
        self.attempts = attempts

    async def grade(self, task: TaskDef, workspace: Path) -> Graded:
        started = time.monotonic()
        grader = f"{task.family}@{GRADER_VERSION}"
        early = _precheck(task, workspace)
        if early is not None:
            return Graded(scored=early, grader=grader, duration_s=0.0, attempts=0)
        run = GraderRun(outcomes={}, error="not run")
        attempt = 0
        for attempt in range(1, self.attempts + 1):
            run = await self._run_once(task, workspace)
            if not run.error or "timed out" in run.error or "too large" in run.error:
                break  # a hang would hang again; a crash may be transient
            log.warning("grader_crashed", task=task.name, attempt=attempt, error=run.error[:300])
        if run.error and "timed out" not in run.error and attempt == self.attempts:
            run = GraderRun(outcomes={}, error=f"grader crashed {attempt} times; last: {run.error}")
        return Graded(
            scored=score_task(task, run),
            grader=grader,
            duration_s=time.monotonic() - started,
            attempts=attempt,
        )

    async def _run_once(self, task: TaskDef, workspace: Path) -> GraderRun:
        box = await self.host.create(f"grade-{uuid.uuid4().hex[:12]}", self.limits)
        try:
            try:
                safe_copy(workspace, box.work, budget_bytes=self.limits.disk_mb * MIB // 2)
            except CopyTooLarge as exc:
                return GraderRun(outcomes={}, error=f"workspace too large to grade: {exc}")
            if task.family == "terminal":
                return await self._run_script(task, box)
            return await self._run_pytest(task, box)
        finally:
            await box.release()

    async def _run_pytest(self, task: TaskDef, box: Sandbox) -> GraderRun:
        hidden = box.work / HIDDEN_DIR
        hidden.mkdir(exist_ok=True)
        for check in task.checks:
            shutil.copyfile(task.folder / check.tests, hidden / Path(check.tests).name)
        ini = box.home / "pytest.ini"
        ini.write_text("[pytest]\njunit_family = xunit1\n")
        junit = box.home / "junit.xml"
        box.own_files()
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--continue-on-collection-errors",
            "-c",
            str(ini),
            "--rootdir",
            str(box.work),
            f"--junitxml={junit}",
            *[f"{HIDDEN_DIR}/{Path(c.tests).name}" for c in task.checks],
        ]
        env = {"PYTHONPATH": str(box.work), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PATH": _path()}
        await box.launch(argv, env=env)
        outcome = await box.wait(timeout_s=task.grader_timeout_s)
        if outcome.killed:
            return GraderRun(
                outcomes={}, error=f"grader timed out after {task.grader_timeout_s:g} s ({outcome.killed})"
            )
        if not junit.is_file():
            return GraderRun(
                outcomes={}, error=f"pytest exited with {outcome.exit_code} and no report: {_tail(box)}"
            )
        try:
            by_file = parse_junit(junit.read_text(errors="replace"))
        except ET.ParseError as exc:
            return GraderRun(outcomes={}, error=f"unreadable test report: {exc}")
        return GraderRun(
            outcomes={c.tests: by_file.get(f"{HIDDEN_DIR}/{Path(c.tests).name}", []) for c in task.checks}
        )

    async def _run_script(self, task: TaskDef, box: Sandbox) -> GraderRun:
        script = box.home / "check.sh"
        shutil.copyfile(task.folder / task.check_script, script)
        box.own_files()
        await box.launch(["/bin/sh", str(script)], env={"PATH": _path()})
        outcome = await box.wait(timeout_s=task.grader_timeout_s)
        if outcome.killed:
            return GraderRun(
                outcomes={},
                error=f"check script timed out after {task.grader_timeout_s:g} s ({outcome.killed})",
            )
        verdicts = parse_verdicts(box.log_path.read_text(errors="replace") if box.log_path.exists() else "")
        if not verdicts and outcome.exit_code != 0:
            return GraderRun(outcomes={}, error=f"check script exited with {outcome.exit_code}: {_tail(box)}")
        return GraderRun(outcomes=verdicts)


def _precheck(task: TaskDef, workspace: Path) -> Scored | None:
    """Bad input raises; a workspace with nothing to grade is `not assessable`; None: grade it."""
    if not workspace.exists():
        raise InvalidArgument("workspace", f"{str(workspace)!r} does not exist")
    if not workspace.is_dir():
        raise InvalidArgument("workspace", f"{str(workspace)!r} is not a folder")
    if not any(workspace.iterdir()):
        return not_assessable("the workspace is empty")
    if not any((workspace / r).exists() for r in task.requires):
        return not_assessable(
            f"nothing gradeable was left: none of {', '.join(task.requires)} exists in the workspace"
        )
    return None


def parse_junit(xml_text: str) -> dict[str, list[str]]:
    """Outcomes per test file of a pytest xunit1 report."""
    out: dict[str, list[str]] = {}
    for case in ET.fromstring(xml_text).iter("testcase"):
        file = case.get("file") or (case.get("classname") or "").replace(".", "/") + ".py"
        if case.find("skipped") is not None:
            result = SKIPPED
        elif case.find("failure") is not None:
            result = FAILED
        elif case.find("error") is not None:
            result = ERRORED
        else:
            result = PASSED
        out.setdefault(file, []).append(result)
    return out


def _path() -> str:
    return f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"


def _tail(box: Sandbox, limit: int = 1500) -> str:
    try:
        return box.log_path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""
