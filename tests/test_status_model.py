"""What `gyre status` says training waits for (pure): each admitted group names the service it
waits on and since when, and running executions past their deadline are listed."""

from __future__ import annotations

from gyre_app.status_model import ExecutionFact, TaskFact, overdue, step_waits, why_waiting

NOW_S = 10_000.0


def task(state: str, *, task_id: str = "t1", submitted_at_s: float = 9_000.0) -> TaskFact:
    return TaskFact(task_id=task_id, state=state, submitted_at_s=submitted_at_s, group_size=2)


def execution(
    state: str, *, eid: str = "e1", task_id: str = "t1", deadline_s: float | None = None
) -> ExecutionFact:
    return ExecutionFact(execution_id=eid, task_id=task_id, state=state, deadline_s=deadline_s)


def test_a_group_with_a_running_execution_waits_for_the_runner() -> None:
    why = why_waiting(task("running"), [execution("running"), execution("finished", eid="e2")])
    assert why == "1 of 2 executions still running (runner)"


def test_a_group_whose_executions_ended_ungraded_waits_for_the_evaluator() -> None:
    why = why_waiting(task("done"), [execution("finished"), execution("timed_out", eid="e2")])
    assert why == "2 executions ended, not graded yet (evaluator)"


def test_a_graded_group_waits_for_the_trainer() -> None:
    why = why_waiting(task("graded"), [execution("graded"), execution("graded", eid="e2")])
    assert why == "graded: waits for a step to take it (trainer)"


def test_an_infrastructure_failure_waits_for_its_replacement() -> None:
    why = why_waiting(task("done"), [execution("graded"), execution("infra_failed", eid="e2")])
    assert "replacement (scheduler)" in why


def test_only_groups_between_admission_and_their_end_wait_oldest_first() -> None:
    tasks = [
        task("graded", task_id="late", submitted_at_s=9_500.0),
        task("done", task_id="early", submitted_at_s=9_000.0),
        task("pending", task_id="not-admitted"),
        task("trained", task_id="over"),
        task("set_aside", task_id="also-over"),
    ]
    waits = step_waits(tasks, [execution("finished", task_id="early")], now_s=NOW_S)
    assert [(w.task_id, w.waited_s) for w in waits] == [("early", 1_000.0), ("late", 500.0)]
    assert waits[0].why == "1 execution ended, not graded yet (evaluator)"


def test_running_executions_past_their_deadline_are_listed_most_overdue_first() -> None:
    executions = [
        execution("running", eid="on-time", deadline_s=NOW_S + 60),
        execution("running", eid="late", deadline_s=NOW_S - 30),
        execution("running", eid="later", deadline_s=NOW_S - 300),
        execution("finished", eid="ended", deadline_s=NOW_S - 900),
        execution("running", eid="unknown"),
    ]
    late = overdue(executions, now_s=NOW_S)
    assert [(o.execution_id, o.past_deadline_s) for o in late] == [("later", 300.0), ("late", 30.0)]
