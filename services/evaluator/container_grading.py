"""Grade a container task by its own tests, in a fresh container of its image (shell: containers).

SWE-bench family, after the agent ended:
    1. a fresh container from the task's image, no network, the task's limits;
    2. the agent's diff against the base commit applied (`git apply --binary`, then
       `patch --fuzz=5` as SWE-bench's harness does); one that does not apply is an assessable 0
       with the reason;
    3. every file the dataset's test patch touches reset to the base, then the test patch applied,
       so edits the agent made to those tests never count; so are the `conftest.py` files the
       agent's diff touched (their hooks run inside pytest and can rewrite its reports);
    4. the test command under `bash -lc` in the workdir, its log parsed by the task's parser and
       scored (`container_scoring`). For pytest logs two canary tests of random names ride along
       (PYTEST_ADDOPTS): a log without the passing one's PASSED line was cut short or forged, a
       log showing the skipped one PASSED had its reports rewritten; either scores 0. Tested
       code that patches pytest from inside the package it imports is not caught (SWE-bench's
       own harness shares this limit): the grade's signals name edits to how tests run.
Harbor: the diff applied the same way, then the hidden tests uploaded into a wiped /tests and
/logs/verifier only now, the verifier run, and the reward file read.

The agent's container is never reused for grading, so nothing it left running or planted
outside its diff reaches the grade. A container that will not start is retried and then
reported `not assessable`; everything the diff causes (a hang, a full disk) scores 0.
"""

from __future__ import annotations

import secrets
import time
import uuid

import structlog

from gyre.errors import GyreError
from gyre.sandbox.backend import ContainerLimits
from gyre.sandbox.oci import Container, OciBackend
from services.evaluator.container_scoring import (
    diff_files,
    patch_refused,
    review_signals,
    score_reward,
    score_tests,
)
from services.evaluator.container_task import ContainerTask
from services.evaluator.grading import Graded
from services.evaluator.scoring import Scored, earned_zero, not_assessable
from services.evaluator.test_logs import TestStatus, parse_test_log

log = structlog.get_logger(__name__)
CONTAINER_GRADER_VERSION = 1
STAGE = "/tmp/gyre-grade"
"""Where the diff and the test patch are written inside the grading container."""
SETUP_TIMEOUT_S = 120.0
APPLY = (
    "git apply --binary --whitespace=nowarn {p} 2>&1 && exit 0; "
    "echo '(git apply refused it; trying patch --fuzz=5)'; patch --batch --fuzz=5 -p1 -i {p} 2>&1"
)


class ContainerGrader:
    def __init__(
        self,
        backend: OciBackend,
        *,
        attempts: int = 2,
        cpus: float = 1.0,
        memory: float = 1.0,
        storage: float = 1.0,
        owner: str = "",
    ):
        self.owner = owner
        """Label of this grader's containers, swept when its evaluator starts again."""
        self.backend = backend
        self.attempts = attempts
        self.multipliers = {"cpus": cpus, "memory": memory, "storage": storage}

    def limits(self, task: ContainerTask) -> ContainerLimits:
        return task.limits.scaled(**self.multipliers)

    async def grade(self, task: ContainerTask, diff: bytes, *, agent_log: str = "") -> Graded:
        """Grade `diff` (the agent's, against the base; b"" for no change)."""
        started = time.monotonic()
        grader = f"{task.family}@{CONTAINER_GRADER_VERSION}"
        test_patch = task.test_patch.read_bytes() if task.family == "swebench" else b""
        signals = review_signals(
            diff=diff.decode(errors="replace"),
            test_patch=test_patch.decode(errors="replace"),
            agent_log=agent_log,
        )
        scored: Scored = not_assessable("not run")
        attempt = 0
        for attempt in range(1, self.attempts + 1):
            try:
                scored = await self._grade_once(
                    task, diff, test_patch, deadline=started + task.grader_timeout_s
                )
                break
            except GyreError as exc:  # the engine: a container that would not start or answer
                scored = not_assessable(f"grading container failed: {exc}")
                log.warning("container_grader_failed", task=task.name, attempt=attempt, error=str(exc)[:300])
        return Graded(
            scored=scored,
            grader=grader,
            duration_s=time.monotonic() - started,
            attempts=attempt,
            signals=signals,
        )

    async def _grade_once(
        self, task: ContainerTask, diff: bytes, test_patch: bytes, *, deadline: float
    ) -> Scored:
        box = await self.backend.create(
            name=f"gyre-grade-{uuid.uuid4().hex[:12]}",
            image=task.image,
            limits=self.limits(task),
            owner=self.owner,
            workdir=task.workdir,
            # Harbor's hidden tests and the verifier's reward go to these only after the agent.
            writable=("/tests", "/logs") if task.family == "harbor" else (),
        )
        try:
            if diff.strip():
                applied = await self._apply(box, task, diff, "agent.diff")
                if applied is not None:
                    return patch_refused("agent's diff", applied)
            if task.family == "harbor":
                return await self._verify_harbor(box, task, deadline=deadline)
            reset = await self._reset_tested_files(box, task, test_patch, agent_diff=diff)
            if reset:
                return not_assessable(f"resetting the test patch's files failed: {reset}")
            applied = await self._apply(box, task, test_patch, "test.patch")
            if applied is not None:  # the dataset's patch on base files: the task is broken
                return not_assessable(
                    f"the dataset's test patch does not apply to the base: {applied[-600:]}"
                )
            canary = await self._plant_canary(box) if task.log_parser == "pytest" else None
            ran = await box.exec(
                ["bash", "-lc", task.test_command],
                timeout_s=max(1.0, deadline - time.monotonic()),
                workdir=task.workdir,
                env={"PYTEST_ADDOPTS": canary[0]} if canary else None,
            )
            if ran.timed_out:
                return earned_zero(f"the tests ran past the grader's deadline of {task.grader_timeout_s:g} s")
            if ran.storage_exceeded:
                return earned_zero(
                    f"the tested code wrote past the storage limit of {box.limits.storage_mb} MB"
                )
            statuses = parse_test_log(task.log_parser, ran.output.decode(errors="replace"))
            if canary is not None:
                reported = [t for t in statuses if t.endswith(canary[1])]
                if not any(statuses[t] == TestStatus.PASSED for t in reported):
                    return earned_zero(
                        "the test run never reported the grader's own canary test: it was cut short "
                        "or its report was written by the tested code"
                    )
                failing = [t for t in statuses if t.endswith(canary[2])]
                if any(statuses[t] == TestStatus.PASSED for t in failing):
                    return earned_zero(
                        "the grader's skipped canary test was reported passed: the tested code "
                        "rewrote pytest's reports"
                    )
                statuses = {t: s for t, s in statuses.items() if t not in reported and t not in failing}
            return score_tests(task, statuses)
        finally:
            await box.close()

    async def _plant_canary(self, box: Container) -> tuple[str, str, str]:
        """A passing and a skipped test of random names outside the workdir, added to pytest's
        arguments: pytest reports both in its end-of-run summary, so a run whose code printed a
        summary of its own and exited early (or crashed) lacks the first, and one whose code
        rewrote every report to passed shows the second passed. (Skipped, not failing: a test
        command with `-x` must not stop at it.) (PYTEST_ADDOPTS path, the passing test's node id
        suffix, the skipped one's)."""
        folder, name = secrets.token_hex(6), secrets.token_hex(6)
        test, bad = secrets.token_hex(6), secrets.token_hex(6)
        path = f"/tmp/gyre-canary-{folder}/test_{name}.py"
        code = (
            f"def test_{test}():\n    pass\n\n\n"
            f"def test_{bad}():\n    import pytest\n\n    pytest.skip('gyre canary')\n"
        )
        await box.write_file(path, code.encode())
        return path, f"test_{name}.py::test_{test}", f"test_{name}.py::test_{bad}"

    async def _apply(self, box: Container, task: ContainerTask, patch: bytes, name: str) -> str | None:
        """None when `patch` applied in the workdir; else the tools' output."""
        path = f"{STAGE}/{name}"
        await box.write_file(path, patch)
        done = await box.exec(
            ["sh", "-c", APPLY.format(p=path)], timeout_s=SETUP_TIMEOUT_S, workdir=task.workdir
        )
        if done.exit_code == 0:
            return None
        return done.output.decode(errors="replace") or f"exit code {done.exit_code}"

    async def _reset_tested_files(
        self, box: Container, task: ContainerTask, test_patch: bytes, *, agent_diff: bytes = b""
    ) -> str:
        """Put every file the test patch touches back to the base (or remove it when the base
        has none), so the patch applies over the agent's edits; "" on success. So are the
        `conftest.py` files the agent's diff touched: pytest runs their hooks in the test run, and
        one hook (`pytest_runtest_makereport`) can report every test passed."""
        files = diff_files(test_patch.decode(errors="replace"))
        files += [
            f
            for f in diff_files(agent_diff.decode(errors="replace"))
            if f.rsplit("/", 1)[-1] == "conftest.py" and f not in files
        ]
        if not files:
            return ""
        script = (
            'for f in "$@"; do '
            'if git cat-file -e "HEAD:$f" 2>/dev/null; then git checkout -q HEAD -- "$f" || exit 1; '
            'else rm -rf -- "$f"; fi; done'
        )
        done = await box.exec(
            ["sh", "-c", script, "reset", *files], timeout_s=SETUP_TIMEOUT_S, workdir=task.workdir
        )
        return "" if done.exit_code == 0 else done.output.decode(errors="replace")[-600:]

    async def _verify_harbor(self, box: Container, task: ContainerTask, *, deadline: float) -> Scored:
        # The tests arrive only now, into folders wiped of anything the diff may have put there.
        wiped = await box.exec(
            # (Contents only: on a read-only root both are tmpfs mount points.)
            ["sh", "-c", "mkdir -p /tests /logs/verifier && find /tests /logs/verifier -mindepth 1 -delete"],
            timeout_s=SETUP_TIMEOUT_S,
        )
        if wiped.exit_code != 0:
            return earned_zero(
                f"/tests or /logs/verifier could not be wiped: {wiped.output.decode(errors='replace')[-300:]}"
            )
        await box.upload(f"{task.folder / task.tests_dir}/.", "/tests")
        timeout_s = min(task.test_timeout_s, max(1.0, deadline - time.monotonic()))
        ran = await box.exec(["bash", "-lc", task.test_command], timeout_s=timeout_s, workdir=task.workdir)
        if ran.timed_out:
            return earned_zero(f"the verifier ran past its timeout of {timeout_s:g} s")
        rewards = {path: await box.download(path, max_bytes=1 << 16) for path in task.reward_files}
        return score_reward(rewards)
