"""Grades of container tasks from what their own tests said, and the signals a reviewer reads (pure).

SWE-bench family: FAIL_TO_PASS and PASS_TO_PASS become two weighted checks; each earns the
share of its tests that passed, so all passing (resolved) is 1.0. A test absent from the log's
parse, SKIPPED or ERROR counts as failed. Harbor: the reward the task's own verifier wrote.

Example (weights 0.7 / 0.3):
    F2P 1/2 passed, P2P 3/3 passed -> 0.7 * 0.5 + 0.3 * 1.0 = 0.65
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping

from services.evaluator.container_task import ContainerTask
from services.evaluator.scoring import FAILED, PASSED, CheckScore, Scored, earned_zero
from services.evaluator.test_logs import TestStatus

_DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
_TEST_PATH = re.compile(r"(^|/)(tests?|testing)/|(^|/)test_[^/]*$|_tests?\.py$|(^|/)conftest\.py$")
_TEST_CONFIG = re.compile(
    r"(^|/)(conftest\.py|pytest\.ini|tox\.ini|setup\.cfg|sitecustomize\.py|usercustomize\.py)$"
)
HISTORY_COMMANDS = re.compile(
    r"\bgit\s+(log|reflog|show|fetch|pull|checkout\s+\S*origin|cat-file|rev-list|fsck|for-each-ref|tag)\b"
)


def score_tests(task: ContainerTask, statuses: Mapping[str, TestStatus]) -> Scored:
    """Weighted F2P/P2P checks from a parsed log; missing, skipped and erroring tests fail."""
    checks = []
    for name, ids, weight in (
        ("fail_to_pass", task.fail_to_pass, task.weight_fail_to_pass),
        ("pass_to_pass", task.pass_to_pass, task.weight_pass_to_pass),
    ):
        if not ids:
            continue
        passed = [t for t in ids if statuses.get(t) == TestStatus.PASSED]
        failed = [t for t in ids if statuses.get(t) != TestStatus.PASSED]
        detail = f"{len(passed)}/{len(ids)} tests passed"
        if failed:
            shown = ", ".join(f"{t} ({_status(statuses.get(t))})" for t in failed[:5])
            detail += f"; failed: {shown}" + (f" and {len(failed) - 5} more" if len(failed) > 5 else "")
        checks.append(
            CheckScore(
                name=name,
                outcome=PASSED if not failed else FAILED,
                weight=weight,
                score=len(passed) / len(ids),
                detail=detail,
            )
        )
    total = round(min(1.0, max(0.0, sum(c.weight * c.score for c in checks))), 6)
    return Scored(score=total, assessable=True, checks=tuple(checks))


def _status(status: TestStatus | None) -> str:
    return "not run" if status is None else str(status).lower()


def score_reward(files: Mapping[str, bytes | None]) -> Scored:
    """A Harbor verifier's reward: the first reward file present, as a number in [0, 1].

    Example: {"/logs/verifier/reward.txt": b"1\\n"} -> score 1.0
             {"/logs/verifier/reward.json": b'{"reward": 0.5}'} -> score 0.5
    """
    for path, data in files.items():
        if data is None:
            continue
        text = data.decode(errors="replace").strip()
        value: object = None
        if path.endswith(".json"):
            try:
                parsed = json.loads(text)
            except ValueError:
                return earned_zero(f"{path} is not JSON: {text[:200]!r}")
            value = parsed.get("reward") if isinstance(parsed, dict) else parsed
        else:
            try:
                value = float(text)
            except ValueError:
                return earned_zero(f"{path} holds no number: {text[:200]!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return earned_zero(f"{path} holds no reward number: {text[:200]!r}")
        reward = min(1.0, max(0.0, float(value)))
        check = CheckScore(
            name="reward",
            outcome=PASSED if reward >= 1.0 else FAILED,
            weight=1.0,
            score=reward,
            detail=f"{path}: {text[:100]}",
        )
        return Scored(score=round(reward, 6), assessable=True, checks=(check,))
    # The verifier ran (the grader checked that) yet wrote no reward: what the graded code did
    # (e.g. removed /logs) is the policy's outcome, never a reason to leave the baseline.
    return earned_zero(f"the verifier wrote none of {', '.join(files)}")


def diff_files(patch: str) -> list[str]:
    """Paths a git diff touches (both sides of a rename).

    Example: diff_files("diff --git a/x.py b/x.py\\n...") -> ["x.py"]
    """
    seen: list[str] = []
    for a, b in _DIFF_HEADER.findall(patch):
        for path in (a, b):
            if path not in seen:
                seen.append(path)
    return seen


def review_signals(*, diff: str, test_patch: str, agent_log: str = "") -> tuple[str, ...]:
    """What a reviewer should look at: the diff editing test files (the dataset's test patch
    overwrites them when grading) and git history commands the agent ran (future commits were
    removed before it started, so any it finds came from elsewhere)."""
    signals = []
    touched = diff_files(diff)
    tested = set(diff_files(test_patch))
    overwritten = [p for p in touched if p in tested]
    if overwritten:
        signals.append("diff edits files the test patch overwrites: " + ", ".join(overwritten[:10]))
    looks_like_tests = [
        p for p in touched if p not in tested and _TEST_PATH.search(p) and not _TEST_CONFIG.search(p)
    ]
    if looks_like_tests:
        signals.append("diff edits test files: " + ", ".join(looks_like_tests[:10]))
    config = [p for p in touched if _TEST_CONFIG.search(p)]
    if config:
        signals.append("diff changes how tests run: " + ", ".join(config[:10]))
    commands = sorted({m.group(0) for m in HISTORY_COMMANDS.finditer(agent_log)})
    if commands:
        signals.append("agent ran git history commands: " + ", ".join(commands[:10]))
    return tuple(signals)


def patch_refused(stage: str, output: str) -> Scored:
    """The agent's diff did not apply: the policy's outcome, an assessable 0 with the reason."""
    return earned_zero(f"the {stage} does not apply: {output.strip()[-600:]}")
