"""Whether an execution whose grade was not assessable gets a replacement (pure).

An unassessable grade is an infrastructure failure (sandbox, grader or runner crash, engine lost):
the execution says nothing about the policy, so it leaves its group's baseline and loss, and the
group may run another execution in its place. The task's `max_infra_retries` bounds the
replacements of its whole group, so a grader that always crashes costs a bounded number of runs.
A policy outcome (wrong code, a timeout) is graded as earned and never reaches this rule.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN_TASK_STATES = ("admitted", "running", "done")
"""A group still rolling out: a replacement can join it. Past `done` the group was ready (it did
not wait for a replacement: the allowance was 0 or spent), trained, set aside or cancelled."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetryDecision:
    replace: bool
    reason: str
    """Why none is scheduled; empty when one is."""


def decide_replacement(
    *,
    task_state: str,
    max_infra_retries: int,
    num_replacements: int,
    limit_s: float,
    execution_cancelled: bool = False,
) -> RetryDecision:
    """Replace while the group is open, the allowance has some left and the deadline some time.

    `num_replacements` counts the group's replacements before this one; `limit_s` is what an
    execution admitted now may run (its timeout cut to the task's deadline).

    Example:
        running, allowance 2, 1 used, 600 s left -> replace
        running, allowance 2, 2 used             -> no: "allowance spent (2 of 2 retries used)"
        cancelled                                -> no: "the task is cancelled"
        the execution alone was cancelled        -> no: its group trains without it

    An execution an operator cancelled is not replaced: the cancel is the operator's decision
    about that run, and a replacement would undo it. Like an infrastructure failure it says
    nothing about the policy, so it leaves the baseline and the loss and the rest of the group
    trains (set aside, the group would waste the other members' finished work); a group left
    with nothing to train on is set aside by the trainer, so either way the group ends.
    """
    if task_state == "cancelled":
        return RetryDecision(replace=False, reason="the task is cancelled")
    if execution_cancelled:
        return RetryDecision(replace=False, reason="the execution was cancelled: its group trains without it")
    # Before the group's state: with the allowance spent the trajectory service did not wait for
    # this decision, so the group may be ready or trained already; the allowance is the reason.
    if num_replacements >= max_infra_retries:
        return RetryDecision(
            replace=False,
            reason=f"allowance spent ({num_replacements} of {max_infra_retries} retries used)",
        )
    if task_state not in OPEN_TASK_STATES:
        return RetryDecision(replace=False, reason=f"the task is {task_state}: its group no longer rolls out")
    if limit_s <= 0:
        return RetryDecision(replace=False, reason="the task's deadline has passed")
    return RetryDecision(replace=True, reason="")
