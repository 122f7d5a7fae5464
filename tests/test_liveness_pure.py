"""The liveness rule's pure parts: what each mode wants of a satellite, a cancelled execution is
never replaced, and a trajectory over the microbatch budget trains alone or is named."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.scheduler.cells import MODES
from services.scheduler.policy.liveness import SatelliteRole, misplaced_satellites, wanted_roles
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
