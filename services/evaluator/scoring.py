"""From test outcomes to a grade with partial credit (pure).

Example (repo_generation, completion_bonus 0.25):
    tokenize (weight 0.4): 3/4 tests pass -> 0.75 * 0.75 + 0 = 0.5625 of its weight
    count    (weight 0.6): 3/3 pass       -> 0.75 * 1.0 + 0.25 = 1.0
    score = 0.4 * 0.5625 + 0.6 * 1.0 = 0.825
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.evaluator.taskset import TaskDef

PASSED, FAILED, ERRORED = "passed", "failed", "errored"


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckScore:
    name: str
    outcome: str
    weight: float
    score: float
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Scored:
    score: float
    assessable: bool
    reason: str = ""
    checks: tuple[CheckScore, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class GraderRun:
    """What one grader run saw: test outcomes by hidden file, or verdict lines of a check script."""

    outcomes: Mapping[str, Sequence[str]]
    """Hidden file (e.g. `hidden/test_count.py`) or script check name -> outcomes of its tests."""
    error: str = ""
    """Why the run gave no verdict (crash, timeout); empty when it did."""
    tampered: str = ""
    """How the graded code forged or disturbed its own verdict; such a run scores 0."""
    workspace_fault: str = ""
    """Why the workspace itself could not be graded (too deep, too big, hangs the grader); such
    a run scores 0 with the reason: failing must never pay less than hanging."""


def not_assessable(reason: str) -> Scored:
    """A failure of the grading machinery: kept out of the group's baseline, never a silent 0."""
    return Scored(score=0.0, assessable=False, reason=reason)


def earned_zero(reason: str) -> Scored:
    """A policy outcome worth nothing (what the workspace holds or does): scored 0, assessable.

    Anything the policy can cause must score at least as badly as failing outright; were it
    `not assessable`, it would leave the group's baseline and a policy would learn to prefer it.
    """
    return Scored(score=0.0, assessable=True, reason=reason)


def score_task(task: TaskDef, run: GraderRun) -> Scored:
    if run.tampered:
        return earned_zero(f"grader integrity check failed: {run.tampered}")
    if run.workspace_fault:
        return earned_zero(f"the workspace cannot be graded: {run.workspace_fault}")
    if run.error:
        return not_assessable(f"grader gave no verdict: {run.error}")
    if task.family == "terminal":
        return _score_script(run, declared=task.verdicts)
    checks = []
    for check in task.checks:
        counted = list(run.outcomes.get(check.tests, ()))  # every expected test: skipped ones too
        if not counted or all(r == ERRORED for r in counted):
            checks.append(
                CheckScore(
                    name=check.name,
                    outcome=ERRORED,
                    weight=check.weight,
                    score=0.0,
                    detail=f"no test of {check.tests} ran to a verdict (import or collection error)",
                )
            )
            continue
        share = sum(r == PASSED for r in counted) / len(counted)
        bonus = task.completion_bonus if task.family == "repo_generation" else 0.0
        credit = (1 - bonus) * share + (bonus if share == 1.0 else 0.0)
        checks.append(
            CheckScore(
                name=check.name,
                outcome=PASSED if share == 1.0 else FAILED,
                weight=check.weight,
                score=credit,
                detail=f"{sum(r == PASSED for r in counted)}/{len(counted)} tests passed",
            )
        )
    return Scored(score=_weighted(checks), assessable=True, checks=tuple(checks))


def _score_script(run: GraderRun, *, declared: Sequence[str] = ()) -> Scored:
    """The check ran (the host saw it start), so silence is the graded code's doing: declared
    verdicts it never printed fail, and a check that printed none of an undeclared set earns 0."""
    if not run.outcomes and not declared:
        return earned_zero("the check script printed no PASS/FAIL verdict")
    if declared:  # names the task declared, and only those: printed extra PASS lines earn nothing
        run = GraderRun(outcomes={name: run.outcomes.get(name, [FAILED]) for name in declared})
    weight = 1.0 / len(run.outcomes)
    checks = tuple(
        CheckScore(
            name=name,
            outcome=PASSED if all(r == PASSED for r in rs) else FAILED,
            weight=weight,
            score=1.0 if all(r == PASSED for r in rs) else 0.0,
        )
        for name, rs in run.outcomes.items()
    )
    return Scored(score=_weighted(checks), assessable=True, checks=checks)


def _weighted(checks: Sequence[CheckScore]) -> float:
    return round(min(1.0, max(0.0, sum(c.weight * c.score for c in checks))), 6)


def parse_verdicts(output: str) -> dict[str, list[str]]:
    """`PASS name` / `FAIL name` lines of a check script.

    Example:
        parse_verdicts("PASS total\\nnoise\\nFAIL names\\n") -> {"total": ["passed"], "names": ["failed"]}
    """
    verdicts: dict[str, list[str]] = {}
    for line in output.splitlines():
        word, _, name = line.strip().partition(" ")
        if word in ("PASS", "FAIL") and name.strip():
            verdicts.setdefault(name.strip(), []).append(PASSED if word == "PASS" else FAILED)
    return verdicts
