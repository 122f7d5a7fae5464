"""The tracker's pure core: a step's row, its sample table and its ATIF trajectories."""

from __future__ import annotations

import pytest

from gyre_app.atif import atif_trajectory
from gyre_app.track_ledger import CallFacts, RunLedger, ToolCallFacts, pick_samples
from gyre_app.track_rows import ExecutionFacts, StepFacts, bin_labels, pass_at_k, reward_histogram, step_row


def step_facts(step: int = 3, task_ids: tuple[str, ...] = ("task-a", "task-b")) -> StepFacts:
    return StepFacts(
        step=step,
        task_ids=task_ids,
        num_groups=len(task_ids),
        num_samples=8,
        num_target_tokens=400,
        staleness_mean=0.5,
        staleness_max=1,
        num_dropped_stale=2,
        loss=0.25,
        grad_norm=1.5,
        duration_s=2.0,
    )


def execution(eid: str, task: str, reward: float | None, **kw: object) -> ExecutionFacts:
    return ExecutionFacts(execution_id=eid, task_id=task, reward=reward, **kw)  # type: ignore[arg-type]


def call(eid: str, n: int, **kw: object) -> CallFacts:
    base: dict[str, object] = {
        "call_id": f"{eid}-c{n}",
        "execution_id": eid,
        "agent_id": "main",
        "started_s": 100.0 + 10 * n,
        "finished_s": 105.0 + 10 * n,
        "num_prompt_tokens": 50,
        "num_output_tokens": 20,
        "hit_context": False,
        "decoded": True,
    }
    return CallFacts(**{**base, **kw})  # type: ignore[arg-type]


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)


def test_reward_histogram_puts_full_credit_in_a_bin_of_its_own() -> None:
    assert reward_histogram([0.0, 0.1, 0.5, 0.99, 1.0, 1.0]) == (2, 0, 1, 0, 1, 2)
    assert bin_labels()[-1] == "1.0"


def test_row_has_rewards_solve_rates_and_pass_at_k_over_assessable_executions_only() -> None:
    executions = [
        execution("a1", "task-a", 1.0),
        execution("a2", "task-a", 1.0),
        execution("b1", "task-b", 0.0),
        execution("b2", "task-b", 0.5),
        execution("b3", "task-b", 0.0, assessable=False),  # an infrastructure failure: not counted
        execution("c1", "task-c", 1.0),  # another step's task
    ]
    row = step_row(step_facts(), executions).scalars
    assert row["reward/mean"] == pytest.approx(0.625)
    assert (row["reward/min"], row["reward/max"]) == (0.0, 1.0)
    assert row["solve_all"] == 0.5 and row["solve_none"] == 0.5 and row["solve_partial"] == 0.0
    assert row["pass_at_1"] == pytest.approx(0.5)  # (2/2 + 0/2) / 2
    assert row["pass_k"] == 2.0
    assert row["executions/unassessable"] == 1.0
    assert row["executions/count"] == 5.0


def test_row_carries_the_trainer_figures_and_leaves_out_what_no_event_said() -> None:
    row = step_row(step_facts(), [])
    assert row.scalars["staleness/mean"] == 0.5 and row.scalars["staleness/max"] == 1.0
    assert row.scalars["samples/dropped_stale"] == 2.0
    assert row.scalars["perf/train_tokens_per_s"] == 200.0
    for absent in (
        "reward/mean",
        "pass_at_1",
        "perf/weight_sync_s",
        "tool_call/parse_errors",
        "cells/rollout_share",
    ):
        assert absent not in row.scalars
    assert row.reward_histogram == ()


def test_row_counts_endings_weight_loads_and_cell_roles() -> None:
    executions = [
        execution("a1", "task-a", 1.0, ending="done"),
        execution("a2", "task-a", 0.0, ending="turn_budget"),
        execution("b1", "task-b", 0.0, ending="timeout"),
        execution("b2", "task-b", 0.0, ending="infrastructure"),
    ]
    row = step_row(
        step_facts(),
        executions,
        weight_sync_s=[0.5, 1.5],
        cell_roles={"cell-0": "training", "cell-1": "rollout", "cell-2": "rollout", "cell-3": "lost"},
    ).scalars
    assert row["termination/done"] == 0.25 and row["termination/turn_budget"] == 0.25
    assert row["termination/timeout"] == 0.25 and row["termination/infrastructure"] == 0.25
    assert row["perf/weight_sync_s"] == 1.0 and row["perf/weight_sync_max_s"] == 1.5
    assert row["cells/rollout_share"] == pytest.approx(2 / 3)


def test_ledger_folds_calls_into_turns_tokens_context_and_parse_errors_then_forgets_the_step() -> None:
    ledger = RunLedger(samples_per_step=2)
    for eid, task, reward in (("a1", "task-a", 1.0), ("a2", "task-a", 0.0), ("z1", "task-z", 0.5)):
        ledger.record_reward(execution_id=eid, task_id=task, reward=reward, assessable=True)
    ledger.record_ending(execution_id="a1", task_id="task-a", ending="done")
    ledger.record_ending(execution_id="a2", task_id="task-a", ending="timeout")
    ledger.record_call(
        call("a1", 0, prompt_text="fix the bug", tool_calls=(ToolCallFacts(name="ls", arguments="{}"),))
    )
    ledger.record_call(call("a1", 1, num_prompt_tokens=0))
    ledger.record_call(call("a2", 0, hit_context=True, num_malformed_tool_calls=1))
    ledger.record_weight_load(0.25)
    out = ledger.complete_step(step_facts(task_ids=("task-a",)))
    row = out.row.scalars
    assert row["executions/turns_mean"] == 1.5
    assert row["executions/output_tokens_mean"] == 30.0
    assert row["termination/done"] == 0.5 and row["termination/context"] == 0.5  # a2 hit the window
    assert row["tool_call/parse_errors"] == 1.0
    assert row["perf/rollout_tokens_per_s"] == pytest.approx(60 / 15)  # 60 tokens from t=100 to t=115
    assert [s["execution_id"] for s in out.samples] == ["a1", "a2"]
    assert out.samples[0]["prompt"] == "fix the bug" and out.samples[0]["tool_calls"] == [
        {"name": "ls", "arguments": "{}"}
    ]
    assert set(out.trajectories) == {"a1", "a2"}
    assert set(ledger.executions) == {"z1"} and set(ledger.calls) == set()  # the step's are forgotten
    assert (
        "perf/weight_sync_s" not in ledger.complete_step(step_facts(step=4, task_ids=("task-z",))).row.scalars
    )


def test_parse_errors_are_not_logged_when_calls_could_not_be_decoded() -> None:
    ledger = RunLedger()
    ledger.record_reward(execution_id="a1", task_id="task-a", reward=1.0, assessable=True)
    ledger.record_call(call("a1", 0, decoded=False))
    assert "tool_call/parse_errors" not in ledger.complete_step(step_facts(task_ids=("task-a",))).row.scalars


def test_samples_alternate_best_and_worst() -> None:
    runs = [
        execution("a", "t", 1.0),
        execution("b", "t", 0.0),
        execution("c", "t", 0.5),
        execution("d", "t", 0.2),
    ]
    assert [e.execution_id for e in pick_samples(runs, 3)] == ["a", "b", "c"]
    assert [e.execution_id for e in pick_samples(runs, 9)] == ["a", "b", "c", "d"]


def test_atif_trajectory_has_a_user_step_then_one_agent_step_per_call_with_tool_calls() -> None:
    calls = [
        call("a1", 1, num_prompt_tokens=0, output_text="done"),
        call(
            "a1",
            0,
            prompt_text="<|im_start|>user\nfix it",
            output_text="Let me look.",
            tool_calls=(ToolCallFacts(name="ls", arguments='{"path": "."}'),),
        ),
    ]
    doc = atif_trajectory(
        execution("a1", "task-a", 1.0, ending="done"), calls, step=3, agent_name="gyre", model_name="policy"
    )
    assert doc["schema_version"] == "ATIF-v1.4" and doc["session_id"] == "a1"
    assert [s["step_id"] for s in doc["steps"]] == [1, 2, 3]
    assert [s["source"] for s in doc["steps"]] == ["user", "agent", "agent"]
    assert doc["steps"][0]["message"] == "<|im_start|>user\nfix it"
    assert doc["steps"][1]["tool_calls"] == [
        {"tool_call_id": "a1-c0-0", "function_name": "ls", "arguments": {"path": "."}}
    ]
    assert doc["final_metrics"] == {
        "total_prompt_tokens": 50,
        "total_completion_tokens": 40,
        "total_steps": 3,
    }
    assert doc["extra"]["reward"] == 1.0 and doc["extra"]["trained_at_step"] == 3


def test_a_set_aside_group_is_forgotten() -> None:
    ledger = RunLedger()
    ledger.record_reward(execution_id="a1", task_id="task-a", reward=1.0, assessable=True)
    ledger.record_call(call("a1", 0))
    ledger.record_reward(execution_id="b1", task_id="task-b", reward=0.0, assessable=True)
    ledger.forget_task("task-a")
    assert set(ledger.executions) == {"b1"} and ledger.calls == {}
