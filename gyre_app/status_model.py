"""What training waits for, from the scheduler's tasks and executions (pure).

`gyre status` shows, for each group a step can take (its task admitted and not yet trained, set
aside or cancelled), why it is not trained yet and since when, and which running executions are
past their deadline. Everything here is derived from facts the shell gathered; no clock is read
(`now_s` comes in).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

WAITING_TASK_STATES = frozenset({"admitted", "running", "done", "graded"})
"""Task states between admission and the end of its group (trained, set aside, cancelled)."""
NOT_ENDED = frozenset({"pending", "admitted", "running"})
ENDED_UNGRADED = frozenset({"finished", "timed_out", "failed"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskFact:
    task_id: str
    state: str
    """The scheduler's task state, lower case without prefix (`admitted`, `graded`, ...)."""
    submitted_at_s: float
    group_size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionFact:
    execution_id: str
    task_id: str
    state: str
    """The scheduler's execution state, lower case without prefix (`running`, `graded`, ...)."""
    deadline_s: float | None = None
    """The runner's deadline (seconds since the epoch) of a running execution; None if unknown."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupWait:
    task_id: str
    state: str
    why: str
    since_s: float
    """When the wait began, as far as known: the task's submission."""
    waited_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Overdue:
    execution_id: str
    task_id: str
    past_deadline_s: float


def why_waiting(task: TaskFact, executions: Sequence[ExecutionFact]) -> str:
    """Why one admitted group is not trained yet, naming the service it waits on.

    Example:
        group of 2, executions running + finished -> "1 of 2 executions still running (runner)"
        group of 2, finished + graded             -> "1 execution ended, not graded yet (evaluator)"
        task graded                               -> "graded: waits for a step to take it (trainer)"
    """
    states = Counter(e.state for e in executions)
    running = sum(states[s] for s in NOT_ENDED)
    if running:
        return f"{running} of {task.group_size} executions still running (runner)"
    ungraded = sum(states[s] for s in ENDED_UNGRADED)
    if ungraded:
        plural = "s" if ungraded > 1 else ""
        return f"{ungraded} execution{plural} ended, not graded yet (evaluator)"
    if states["infra_failed"] and task.state != "graded":
        return f"{states['infra_failed']} infrastructure failure(s): waits for a replacement (scheduler)"
    if task.state == "graded":
        return "graded: waits for a step to take it (trainer)"
    return "every execution graded: waits for its calls to be stored (trajectory)"


def step_waits(
    tasks: Sequence[TaskFact], executions: Sequence[ExecutionFact], *, now_s: float
) -> list[GroupWait]:
    """Every group between admission and its end, longest waiting first, with why it waits."""
    by_task: dict[str, list[ExecutionFact]] = {}
    for e in executions:
        by_task.setdefault(e.task_id, []).append(e)
    waits = [
        GroupWait(
            task_id=t.task_id,
            state=t.state,
            why=why_waiting(t, by_task.get(t.task_id, [])),
            since_s=t.submitted_at_s,
            waited_s=max(0.0, now_s - t.submitted_at_s),
        )
        for t in tasks
        if t.state in WAITING_TASK_STATES
    ]
    return sorted(waits, key=lambda w: (w.since_s, w.task_id))


def overdue(executions: Sequence[ExecutionFact], *, now_s: float) -> list[Overdue]:
    """Running executions past their deadline (the runner should have ended them), most overdue first."""
    late = [
        Overdue(execution_id=e.execution_id, task_id=e.task_id, past_deadline_s=now_s - e.deadline_s)
        for e in executions
        if e.state == "running" and e.deadline_s is not None and e.deadline_s < now_s
    ]
    return sorted(late, key=lambda o: -o.past_deadline_s)
