"""Grade a workspace inside a sandbox, never outside it (shell: sandboxes, files, processes).

The workspace is copied (`gyre.sandbox.trees`: by descriptor, folders, regular files and links
only, bounded in files, depth, bytes and time) into a fresh sandbox with its own user, quota and
no network; the hidden tests or check script go into a root-owned folder beside it that the
sandbox user can read but not write (the expected values never go in); the grader runs there
under the task's deadline, which the copy counts against. pytest reports through a pipe whose
read end only this process holds, and `integrity` judges the report, so the graded code cannot
write or forge its own score.

Every workspace gets a grade. What the workspace causes (too deep, too big, too many files, a
copy or a test run past the deadline) scores 0 with the reason: hanging must never pay better
than failing. Only a failure of the grading machinery itself, proved by host facts
(`gyre.sandbox.blame`: the grading sandbox's set-up never reported that the grader started; the
reporter's first line, written before any graded code runs, never came) is retried and then
reported `not assessable`. Nothing the graded code prints or does can trigger a retry.

A check script (terminal tasks) runs as an execute-only copy of the shell, so the kernel makes
it non-dumpable: the programs it starts, under the same uid, cannot read its memory,
environment or descriptors. It runs as its sandbox's first process (pid 1 of the pid namespace),
so they cannot signal it either: the kernel drops a signal sent to a namespace's first process
from inside it unless that process handles it, and SIGKILL and SIGSTOP always. Its text reaches
it in its environment, which it drops before it runs, never as a file in the sandbox. Its
verdicts travel on its stdout, a pipe only this process reads; a check that does not exit 0 by
itself has every verdict failed: a program can print PASS lines into its stdout, never keep a
FAIL line out of it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog

from gyre.errors import InvalidArgument
from gyre.sandbox.blame import Blame, HostFacts, blame
from gyre.sandbox.host import Outcome, Sandbox, SandboxHost
from gyre.sandbox.limits import MIB, SandboxLimits
from gyre.sandbox.trees import CopyBounds, CopyRefused, bounded_copy
from services.evaluator.integrity import judge_records, with_canary
from services.evaluator.scoring import (
    GraderRun,
    Scored,
    earned_zero,
    parse_verdicts,
    score_task,
)
from services.evaluator.taskset import TaskDef

if TYPE_CHECKING:  # container_grading builds on Graded below
    from services.evaluator.container_grading import ContainerGrader

log = structlog.get_logger(__name__)
GRADER_VERSION = 4
"""3: values compared outside the tested process, skipped and missing tests fail, workspace faults score 0.
4: only host-proven set-up failures are not assessable; a check script's silence, death or
non-zero exit fails its verdicts."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Graded:
    scored: Scored
    grader: str
    duration_s: float
    attempts: int
    signals: tuple[str, ...] = ()
    """What a reviewer should look at (container tasks: test files edited, git history read)."""


class Grader:
    def __init__(
        self,
        host: SandboxHost,
        limits: SandboxLimits,
        *,
        attempts: int = 3,
        max_files: int = 100_000,
        max_depth: int = 64,
    ):
        self.containers: ContainerGrader | None = None
        """Grades tasks that bring their own image; None when this host has no container engine
        (set by the service's wiring)."""
        self.host = host
        self.limits = limits
        self.attempts = attempts
        self.max_files = max_files
        self.max_depth = max_depth

    async def grade(self, task: TaskDef, workspace: Path) -> Graded:
        started = time.monotonic()
        grader = f"{task.family}@{GRADER_VERSION}"
        early = _precheck(task, workspace)
        if early is not None:
            return Graded(scored=early, grader=grader, duration_s=0.0, attempts=0)
        run = GraderRun(outcomes={}, error="not run")
        attempt = 0
        for attempt in range(1, self.attempts + 1):
            try:
                run = await self._run_once(task, workspace)
            except OSError as exc:  # the host's side: sandbox folders, users, cgroups
                run = GraderRun(outcomes={}, error=f"grading sandbox failed: {exc}")
            if not run.error:
                break  # a verdict, a forgery or a fault of the workspace: the same next time
            log.warning("grader_crashed", task=task.name, attempt=attempt, error=run.error[:300])
        if run.error:
            run = GraderRun(outcomes={}, error=f"grader crashed {attempt} times; last: {run.error}")
        return Graded(
            scored=score_task(task, run),
            grader=grader,
            duration_s=time.monotonic() - started,
            attempts=attempt,
        )

    async def _run_once(self, task: TaskDef, workspace: Path) -> GraderRun:
        deadline = time.monotonic() + task.grader_timeout_s  # the copy counts against it
        box = await self.host.create(f"grade-{uuid.uuid4().hex[:12]}", self.limits)
        try:
            bounds = CopyBounds(
                max_files=self.max_files,
                max_depth=self.max_depth,
                max_bytes=self.limits.disk_mb * MIB // 2,
                deadline=deadline,
            )
            try:
                await asyncio.to_thread(bounded_copy, workspace, box.work, bounds)
            except CopyRefused as exc:
                return GraderRun(outcomes={}, workspace_fault=str(exc))
            if task.family == "terminal":
                return await self._run_script(task, box, deadline=deadline)
            return await self._run_pytest(task, box, deadline=deadline)
        finally:
            await box.release()

    async def _run_pytest(self, task: TaskDef, box: Sandbox, *, deadline: float) -> GraderRun:
        """pytest as the sandbox user over hidden tests it cannot write, reporting through a pipe
        only this process reads; the workspace's conftest, ini files and site hooks are ignored."""
        trusted = _trusted_folder(box)
        files: dict[str, str] = {}
        canaries: dict[str, str] = {}
        expected: dict[str, Mapping[str, Any]] = {}
        for check in task.checks:
            name = Path(check.tests).name
            files[name] = check.tests
            expected[name] = check.expected
            canaries[name] = f"test_{secrets.token_hex(6)}"
            source = (task.folder / check.tests).read_text()
            _write_trusted(trusted / name, with_canary(source, canaries[name]))
        _write_trusted(trusted / "pytest.ini", "[pytest]\naddopts =\n")
        _write_trusted(trusted / "grade_report.py", REPORTER.read_text())
        box.own_files()
        argv = [
            sys.executable,
            "-I",
            "-B",
            str(trusted / "grade_report.py"),
            "-q",
            "-p",
            "no:cacheprovider",
            "--noconftest",
            "--continue-on-collection-errors",
            "-c",
            str(trusted / "pytest.ini"),
            "--rootdir",
            str(trusted),
            *[str(trusted / name) for name in files],
        ]
        read_end, write_end = os.pipe()
        pipe = _PipeReader(read_end)
        env = {
            "GYRE_REPORT_FD": str(write_end),
            "GYRE_WORK": str(box.work),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PATH": _path(),
        }
        try:
            await box.launch(argv, env=env, pass_fds=(write_end,), read_only=[trusted])
        except BaseException:
            os.close(write_end)
            await asyncio.to_thread(pipe.finish)  # EOF now: no writer is left
            raise
        os.close(write_end)  # from here on only the sandboxed pytest holds a write end
        outcome = await box.wait(timeout_s=max(0.0, deadline - time.monotonic()))
        lines = await asyncio.to_thread(pipe.finish)
        blamed = _blame(outcome)
        if blamed.infrastructure:
            return GraderRun(outcomes={}, error=await _did_not_start(box, blamed))
        if outcome.killed:
            return GraderRun(outcomes={}, workspace_fault=_late(task, outcome.killed))
        if pipe.stuck:
            return GraderRun(outcomes={}, tampered="a process of the graded code kept the report open")
        if pipe.overflow:
            return GraderRun(outcomes={}, tampered=f"the report passed {REPORT_LIMIT // MIB} MiB")
        run = judge_records(lines, files=files, expected=expected, canaries=canaries)
        if run.error:
            why = f"{run.error}; pytest exited with {outcome.exit_code}: {await box.log_tail(1500)}"
            run = GraderRun(outcomes={}, error=why)
        return run

    async def _run_script(self, task: TaskDef, box: Sandbox, *, deadline: float) -> GraderRun:
        trusted = _trusted_folder(box)
        shell = _execute_only_shell(trusted)
        box.own_files()
        env = {"PATH": _path(), "GYRE_CHECK": (task.folder / task.check_script).read_text()}
        read_end, write_end = os.pipe()
        verdicts = _PipeReader(read_end)
        try:
            await box.launch(
                [str(shell), "-c", CHECK_WRAPPER],
                env=env,
                read_only=[trusted],
                stdout_fd=write_end,
                as_first_process=True,
            )
        except BaseException:
            os.close(write_end)
            await asyncio.to_thread(verdicts.finish)
            raise
        os.close(write_end)
        outcome = await box.wait(timeout_s=max(0.0, deadline - time.monotonic()))
        lines = await asyncio.to_thread(verdicts.finish)
        blamed = _blame(outcome)
        if blamed.infrastructure:
            return GraderRun(outcomes={}, error=await _did_not_start(box, blamed))
        if outcome.killed:
            return GraderRun(outcomes={}, workspace_fault=_late(task, outcome.killed))
        if verdicts.stuck or verdicts.overflow:
            return GraderRun(
                outcomes={}, tampered="a process of the graded code kept or flooded the verdicts"
            )
        if outcome.exit_code != 0:  # its verdicts cannot be told from what a program printed
            return GraderRun(
                outcomes={},
                workspace_fault=f"the check script did not exit 0 by itself (exit {outcome.exit_code}): "
                "every verdict failed",
            )
        return GraderRun(outcomes=parse_verdicts("\n".join(lines)))  # declared but missing: failed


CHECK_WRAPPER = 'script=$GYRE_CHECK; unset GYRE_CHECK; eval "$script"'
"""The check's text arrives in its environment and is dropped before it runs: the programs it
starts inherit neither a copy nor a path to it."""


def _blame(outcome: Outcome) -> Blame:
    return blame(
        HostFacts(
            started=outcome.started,
            setup_errno=outcome.setup_errno,
            setup_error=outcome.setup_error,
            killed=outcome.killed,
            exit_code=outcome.exit_code,
        )
    )


async def _did_not_start(box: Sandbox, blamed: Blame) -> str:
    setup_log = await box.log_tail(1500, name="sandbox.log")  # for the operator, not the verdict
    return f"the grading sandbox did not start: {blamed.reason}\n{setup_log}".strip()


def _late(task: TaskDef, killed: str) -> str:
    if killed == "disk_quota":
        return "the tested code filled the grading sandbox's disk quota"
    return f"copying and testing it ran past the grader's deadline of {task.grader_timeout_s:g} s"


REPORTER = Path(__file__).resolve().parent / "grade_report.py"
REPORT_LIMIT = 8 * MIB


def _trusted_folder(box: Sandbox) -> Path:
    """Root-owned, readable by the sandbox user, writable only by the host: grader files live
    here, outside the workspace, so workspace code cannot plant or rewrite them."""
    folder = box.path / "grader"
    folder.mkdir(mode=0o755, exist_ok=True)
    os.chown(folder, 0, 0)
    os.chmod(folder, 0o755)
    return folder


def _execute_only_shell(folder: Path) -> Path:
    """A copy of /bin/sh the sandbox user may run but not read: the kernel then starts it
    non-dumpable (suid_dumpable), out of reach of the same uid's /proc/<pid>/mem, fd, environ."""
    shell = folder / "sh"
    shell.write_bytes(Path(os.path.realpath("/bin/sh")).read_bytes())
    os.chmod(shell, 0o111)
    return shell


def _write_trusted(path: Path, text: str) -> None:
    path.write_text(text)
    os.chmod(path, 0o444)


class _PipeReader:
    """Drains the report pipe on a thread (a full pipe would block pytest) until EOF."""

    def __init__(self, fd: int):
        self.fd = fd
        self.chunks: list[bytes] = []
        self.size = 0
        self.overflow = False
        self.stuck = False
        self.thread = threading.Thread(target=self._drain, daemon=True)
        self.thread.start()

    def _drain(self) -> None:
        while True:
            data = os.read(self.fd, 65536)
            if not data:
                return
            self.size += len(data)
            if self.size > REPORT_LIMIT:
                self.overflow = True
            else:
                self.chunks.append(data)

    def finish(self) -> list[str]:
        """The lines written; the sandbox is gone, so every write end is closed and EOF comes."""
        self.thread.join(timeout=10.0)
        if self.thread.is_alive():  # a write end survived (no pid namespace): stop listening
            self.stuck = True
        else:
            os.close(self.fd)
        return b"".join(self.chunks).decode(errors="replace").splitlines()


def _precheck(task: TaskDef, workspace: Path) -> Scored | None:
    """Bad input raises; a workspace the policy left with nothing to grade earns 0; None: grade it."""
    if not workspace.exists():
        raise InvalidArgument("workspace", f"{str(workspace)!r} does not exist")
    if not workspace.is_dir():
        raise InvalidArgument("workspace", f"{str(workspace)!r} is not a folder")
    if not any(workspace.iterdir()):
        return earned_zero("the workspace is empty")
    if not any((workspace / r).exists() for r in task.requires):
        return earned_zero(
            f"nothing gradeable was left: none of {', '.join(task.requires)} exists in the workspace"
        )
    return None


def _path() -> str:
    return f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin"
