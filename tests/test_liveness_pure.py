"""The liveness rule's pure parts: what each mode wants of a satellite, a cancelled execution is
never replaced, a trajectory over the microbatch budget trains alone or is named, and when the
watchdog acts on an execution no runner reports an end for."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.scheduler.cells import MODES
from services.scheduler.policy.liveness import (
    SatelliteRole,
    WatchedExecution,
    blind_time_s,
    limit_at_s,
    misplaced_satellites,
    overdue_executions,
    wanted_roles,
)
from services.scheduler.retries import decide_replacement
from services.trainer.microbatch import MicrobatchTooLarge, oversized_trajectories, plan_microbatches
from services.trainer.samples import Sample


def sample(execution_id: str, trajectory_id: str, token_ids: list[int]) -> Sample:
    n = len(token_ids)
    return Sample(
        execution_id=execution_id,
        trajectory_id=trajectory_id,
        agent_role="main",
        token_ids=tuple(token_ids),
        loss_mask=(False,) + (True,) * (n - 1),
        token_weight=(0.0,) + (1.0,) * (n - 1),
        old_logprobs=(0.0,) * n,
        policy_versions=(0,) * n,
        reward=1.0,
        advantage=0.0,
    )


def test_async_sends_a_training_satellite_back_and_leaves_one_mid_switch_alone() -> None:
    roles = [
        SatelliteRole(cell_id="cell-1", role="training"),
        SatelliteRole(cell_id="cell-2", role="rollout"),
        SatelliteRole(cell_id="cell-3", role="switching"),
        SatelliteRole(cell_id="cell-4", role="lost"),
    ]
    assert misplaced_satellites("async", roles) == ("cell-1",)
    assert misplaced_satellites("gyre", roles) == ()


@given(
    st.lists(st.sampled_from(MODES), min_size=1, max_size=8),
    st.lists(st.sampled_from(["rollout", "training", "switching", "lost"]), min_size=1, max_size=4),
)
def test_after_any_sequence_of_modes_every_settled_satellite_ends_in_a_wanted_role(
    modes: list[str], start: list[str]
) -> None:
    roles = {f"cell-{i + 1}": r for i, r in enumerate(start)}
    for mode in modes:  # each SetMode, then a driver round that switches what is misplaced
        for cell_id in misplaced_satellites(
            mode, [SatelliteRole(cell_id=c, role=r) for c, r in roles.items()]
        ):
            roles[cell_id] = "rollout"
        settled = [r for r in roles.values() if r in ("rollout", "training")]
        assert all(r in wanted_roles(mode) for r in settled)


def test_every_live_mode_wants_something() -> None:
    for mode in MODES:
        assert "rollout" in wanted_roles(mode)
    with pytest.raises(KeyError):
        wanted_roles("fast")


def test_a_cancelled_execution_is_never_replaced_however_many_retries_are_left() -> None:
    decision = decide_replacement(
        task_state="running", max_infra_retries=3, num_replacements=0, limit_s=600, execution_cancelled=True
    )
    assert not decision.replace and "cancelled" in decision.reason


def test_a_trajectory_over_the_budget_trains_in_a_microbatch_of_its_own() -> None:
    short_a = sample("e1", "t1", [1, 2, 3, 100])
    long = sample("e1", "t2", list(range(1, 30)))
    short_b = sample("e1", "t3", [1, 2, 3, 101])
    plan = plan_microbatches([short_a, long, short_b], max_tokens=8, max_sample_tokens=32)
    assert [[s.trajectory_id for s in mb] for mb in plan] == [["t1"], ["t2"], ["t3"]]


def test_a_trajectory_past_what_the_trainer_holds_is_named_with_its_size() -> None:
    long = sample("e2", "t9", list(range(1, 41)))
    assert oversized_trajectories([sample("e1", "t1", [1, 2]), long], max_sample_tokens=32) == {
        "e2": oversized_trajectories([long], max_sample_tokens=32)["e2"]
    }
    assert "40 tokens" in oversized_trajectories([long], max_sample_tokens=32)["e2"]
    with pytest.raises(MicrobatchTooLarge):
        plan_microbatches([long], max_tokens=8, max_sample_tokens=32)


def watched(
    state: str = "running", *, since_s: float = 0.0, deadline_s: float | None = None
) -> WatchedExecution:
    return WatchedExecution(
        execution_id="e1", state=state, since_s=since_s, timeout_s=60.0, deadline_s=deadline_s
    )


def test_a_running_execution_is_left_alone_until_its_limit_plus_a_grace_then_cancelled_then_ended() -> None:
    [running] = [watched(since_s=100.0)]
    assert overdue_executions([running], now_s=169.9, grace_s=10.0) == ()
    [cancel] = overdue_executions([running], now_s=175.0, grace_s=10.0)
    assert cancel.action == "cancel" and cancel.past_limit_s == 15.0
    [end] = overdue_executions([running], now_s=180.0, grace_s=10.0)
    assert end.action == "end"
    assert end.reason == "no end from the runner 20 s past its limit"


def test_an_admitted_execution_is_bounded_by_its_deadline_alone() -> None:
    # Queued at a runner, an execution may wait for others: its timeout counts from its start.
    assert overdue_executions([watched("admitted")], now_s=1e9, grace_s=10.0) == ()
    [end] = overdue_executions([watched("admitted", deadline_s=500.0)], now_s=520.0, grace_s=10.0)
    assert end.action == "end" and end.past_limit_s == 20.0
    assert limit_at_s(watched("admitted", deadline_s=500.0)) == 500.0


@given(
    since=st.floats(0, 1e6),
    now=st.floats(0, 2e6),
    grace=st.floats(0.01, 1e4),
)
def test_nothing_is_acted_on_before_the_runner_s_own_limit_plus_the_grace(
    since: float, now: float, grace: float
) -> None:
    for item in overdue_executions([watched(since_s=since)], now_s=now, grace_s=grace):
        assert now >= since + 60.0 + grace
        assert item.action == ("end" if now - since - 60.0 >= 2 * grace else "cancel")


def test_time_the_watchdog_could_not_look_does_not_count_against_an_execution() -> None:
    assert blind_time_s(last_look_s=100.0, now_s=104.0, every_s=5.0) == 0.0
    assert blind_time_s(last_look_s=100.0, now_s=160.0, every_s=5.0) == 55.0
