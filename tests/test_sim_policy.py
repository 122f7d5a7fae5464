"""The scheduling policies' decisions on small hand-made cluster states (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from services.scheduler.policy import burst, colocate, elastic, fixed_split
from services.scheduler.policy.elastic import ElasticKnobs, balanced_rollout_cells
from services.scheduler.policy.migration import Move, max_freeable, plan_drain
from services.scheduler.policy.staleness import (
    admissible_groups,
    admission_cap,
    groups_for_step,
    groups_to_admit,
)
from services.scheduler.policy.state import ClusterView, Decision, PolicyConfig, ReadyGroup

# 8 cells of 4 slots, groups of 4, steps of 2 groups, staleness bound 1.
CONFIG = PolicyConfig(
    num_cells=8,
    slots_per_cell=4,
    groups_per_step=2,
    group_size=4,
    max_staleness=1,
    total_groups=20,
    step_overhead_s=0.0,
    rollout_to_training_s=8.0,
    training_to_rollout_s=4.0,
)
EMPTY = ClusterView(
    now_s=100.0,
    version=0,
    rollout_cells=7,
    training_cells=1,
    switching_to_rollout=0,
    switching_to_training=0,
    running=0,
    groups_admitted=0,
    queued_groups=20,
    running_groups=(),
    ready=(),
    step_groups=0,
    step_untrained_tokens=0,
    in_overhead=False,
    training_starved_since_s=None,
    rollout_cell_s_per_group=None,
    training_cell_s_per_group=None,
)


def ready(group_id: int, version: int, tokens: int = 1000) -> ReadyGroup:
    return ReadyGroup(group_id=group_id, version=version, tokens=tokens)


# -- staleness --------------------------------------------------------------------------------------


def test_admission_cap_is_k_plus_one_steps_ahead_of_the_version() -> None:
    assert admission_cap(version=0, admitted=40, max_staleness=2, groups_per_step=16) == 8
    assert admission_cap(version=1, admitted=40, max_staleness=2, groups_per_step=16) == 24
    assert admission_cap(version=0, admitted=60, max_staleness=2, groups_per_step=16) == 0


def test_batch_sync_releases_one_batch_and_waits_for_it() -> None:
    config = replace(CONFIG, groups_per_step=4)
    partly = replace(EMPTY, groups_admitted=6, queued_groups=100, running_groups=((0, 2),))
    assert admissible_groups(partly, config, batch_sync=False) == 2  # cap (0+1+1)*4 - 6
    assert admissible_groups(partly, config, batch_sync=True) == 2  # the rest of batch 1
    finished_batch = replace(partly, groups_admitted=8, running_groups=((0, 1),))
    assert admissible_groups(finished_batch, config, batch_sync=True) == 0
    assert (
        admissible_groups(replace(finished_batch, version=1, running_groups=()), config, batch_sync=True) == 4
    )


def test_streaming_keeps_a_place_for_a_running_due_group() -> None:
    groups = [ready(9, 3), ready(7, 2), ready(8, 3)]
    common = {"step": 3, "places": 3, "ready": groups, "max_staleness": 1, "groups_per_step": 3}
    assert groups_for_step(**common, running=((2, 1),), streaming=True) == (7, 8)  # type: ignore[arg-type]
    assert groups_for_step(**common, running=((2, 1),), streaming=False) == ()  # type: ignore[arg-type]
    assert groups_for_step(**common, running=(), streaming=False) == (7, 8, 9)  # type: ignore[arg-type]


def test_a_young_group_is_not_taken_when_it_would_push_older_ones_past_their_deadline() -> None:
    # K=1, B=2, step 0 has 2 places. Due by step 1: g0 (ready, v0) and three running groups of v0.
    # Taking g5 (v1, due by 2) would leave 2+2-1 = 3 places for the 4 groups due by step 1.
    groups = [ready(0, 0), ready(5, 1)]
    args = {"step": 0, "places": 2, "max_staleness": 1, "groups_per_step": 2, "streaming": True}
    assert groups_for_step(ready=groups, running=((0, 3),), **args) == (0,)  # type: ignore[arg-type]
    assert groups_for_step(ready=groups, running=((0, 2),), **args) == (0, 5)  # type: ignore[arg-type]


def test_non_streaming_step_waits_for_a_full_batch() -> None:
    args = {
        "step": 0,
        "places": 2,
        "running": (),
        "max_staleness": 1,
        "groups_per_step": 2,
        "streaming": False,
    }
    assert groups_for_step(ready=[ready(0, 0)], **args) == ()  # type: ignore[arg-type]
    assert groups_for_step(ready=[ready(1, 0), ready(0, 0)], **args) == (0, 1)  # type: ignore[arg-type]


# -- migration --------------------------------------------------------------------------------------


def test_drain_frees_the_emptiest_cells_into_the_fullest_with_room() -> None:
    assert max_freeable(loads=[4, 1, 0, 3], slots_per_cell=4) == 2
    plan = plan_drain(loads={1: 4, 2: 1, 3: 0, 4: 3}, slots_per_cell=4, count=2)
    assert plan.freed == (3, 2)
    assert plan.moves == (Move(source=2, target=4, executions=1),)


def test_drain_never_overfills_and_frees_only_what_fits() -> None:
    assert plan_drain(loads={1: 3, 2: 3, 3: 3}, slots_per_cell=4, count=3).freed == ()  # 9 need 3 cells
    plan = plan_drain(loads={1: 2, 2: 3, 3: 3}, slots_per_cell=4, count=3)  # 8 need 2: free one
    assert plan.freed == (1,)
    assert plan.moves == (Move(source=1, target=2, executions=1), Move(source=1, target=3, executions=1))


# -- colocate ---------------------------------------------------------------------------------------


def test_colocate_rolls_out_exactly_one_step_then_switches_everyone() -> None:
    start = replace(EMPTY, rollout_cells=8, training_cells=0)
    assert colocate.decide(start, CONFIG) == Decision(admit=2)
    half = replace(
        start, groups_admitted=2, queued_groups=18, running=4, running_groups=((0, 1),), ready=(ready(0, 0),)
    )
    assert colocate.decide(half, CONFIG) == Decision()  # training waits for the slowest group
    both = replace(half, running=0, running_groups=(), ready=(ready(0, 0), ready(1, 0)))
    assert colocate.decide(both, CONFIG) == Decision(assign=(0, 1), to_training=8)
    published = replace(both, version=1, ready=(), rollout_cells=0, training_cells=8)
    assert colocate.decide(published, CONFIG) == Decision(to_rollout=8)


# -- async ------------------------------------------------------------------------------------------


def test_vanilla_async_refills_free_slots_but_trains_whole_batches() -> None:
    pool = replace(EMPTY, rollout_cells=2, training_cells=6)
    one = replace(
        pool, groups_admitted=2, queued_groups=18, running=4, running_groups=((0, 1),), ready=(ready(0, 0),)
    )
    # g0's 4 slots are refilled at once; g0 waits for g1 (no streaming).
    assert fixed_split.decide(one, CONFIG, streaming=False, batch_sync=False) == Decision(admit=1)


def test_batch_synchronous_split_trains_whole_batches_and_releases_the_next_after_the_last() -> None:
    pool = replace(EMPTY, rollout_cells=2, training_cells=6)  # 8 slots: two groups
    assert fixed_split.decide(pool, CONFIG, streaming=False, batch_sync=True) == Decision(admit=2)
    one = replace(
        pool, groups_admitted=2, queued_groups=18, running=4, running_groups=((0, 1),), ready=(ready(0, 0),)
    )
    assert fixed_split.decide(one, CONFIG, streaming=False, batch_sync=True) == Decision()
    both = replace(one, running=0, running_groups=(), ready=(ready(0, 0), ready(1, 0)))
    assert fixed_split.decide(both, CONFIG, streaming=False, batch_sync=True) == Decision(
        assign=(0, 1), admit=2
    )


def test_streaming_async_trains_what_is_ready_and_refills_free_slots() -> None:
    pool = replace(EMPTY, rollout_cells=2, training_cells=6)
    one = replace(
        pool, groups_admitted=2, queued_groups=18, running=4, running_groups=((0, 1),), ready=(ready(0, 0),)
    )
    assert fixed_split.decide(one, CONFIG, streaming=True, batch_sync=False) == Decision(assign=(0,), admit=1)


# -- gyre elastic -----------------------------------------------------------------------------------


def test_balanced_split_equalises_rollout_and_training_time() -> None:
    split = balanced_rollout_cells(
        num_cells=8, groups_per_step=2, rollout_cell_s=16.0, training_cell_s=8.0, overhead_s=0.0
    )
    assert split == pytest.approx(16 / 3)  # 32/r = 16/(8-r)


def test_gyre_streams_a_ready_group_and_frees_a_surplus_satellite_for_it() -> None:
    # 7 satellites roll out with 20 of 28 slots used; the cap lets 2 more groups in (8 executions).
    view = replace(
        EMPTY,
        running=20,
        groups_admitted=5,
        queued_groups=15,
        running_groups=((0, 4),),  # 5 admitted: 4 running, 1 ready
        ready=(ready(0, 0),),
        rollout_cell_s_per_group=16.0,
        training_cell_s_per_group=8.0,
    )
    decision = elastic.decide(view, CONFIG)
    # cap (0+1+1)*2 - 5 < 0 -> nothing to admit; need 5 cells now, 7 soon (next version's groups);
    # the split allows at most ceil(5.33) = 6 rollout cells: drain 1 to join the step.
    assert decision == Decision(assign=(0,), to_training=1)


def test_gyre_frees_the_rollout_tail_when_the_queue_is_empty() -> None:
    tail = replace(
        EMPTY,
        version=9,
        rollout_cells=6,
        training_cells=2,
        running=4,
        groups_admitted=20,
        queued_groups=0,
        running_groups=((9, 1),),
        step_groups=1,
        step_untrained_tokens=5000,
        rollout_cell_s_per_group=16.0,
        training_cell_s_per_group=8.0,
    )
    assert elastic.decide(tail, CONFIG) == Decision(to_training=5)  # 4 executions fit on 1 cell


def test_gyre_trains_on_idle_rollout_cells_until_a_distant_update_releases_more_groups() -> None:
    # The staleness cap holds the queue (version 2, K=1: 8 groups admitted, none admissible); 5
    # rollout cells hold 8 executions (2 cells' worth). The step trains 2 assigned groups.
    config = replace(CONFIG, tokens_per_s_per_cell=1000.0)
    capped = replace(
        EMPTY, version=2, rollout_cells=5, training_cells=3, running=8, groups_admitted=8,
        queued_groups=12, running_groups=((1, 1), (2, 1)), step_groups=2,
        rollout_cell_s_per_group=16.0, training_cell_s_per_group=8.0,
    )  # fmt: skip
    # 300,000 untrained tokens on 3 cells: the next release is 100 s off, far more than the
    # 12 s round trip plus 8 s switch-in: keep only the 2 cells the running executions need.
    far = replace(capped, step_untrained_tokens=300_000)
    assert elastic.next_release_s(far, config) == pytest.approx(100.0)
    assert elastic.decide(far, config).to_training == 3
    # 30,000 tokens: 10 s off; freeing cells now would call them back at once, so keep the 2
    # groups the release brings in view (4 cells).
    near = replace(capped, step_untrained_tokens=30_000)
    assert elastic.decide(near, config).to_training == 1


def test_gyre_never_moves_the_core_cell_and_pulls_idle_satellites_back_to_rollout() -> None:
    starved = replace(
        EMPTY, rollout_cells=0, training_cells=1, version=1, groups_admitted=2, queued_groups=18,
        training_starved_since_s=0.0,
    )  # fmt: skip
    assert elastic.decide(starved, CONFIG).to_rollout == 0  # only the core trains: it stays
    two = replace(starved, training_cells=3)
    decision = elastic.decide(two, CONFIG)
    assert decision.to_rollout == 2 and decision.admit == 0  # admit once they have switched


def test_gyre_never_shrinks_the_pool_below_one_group_while_the_queue_waits() -> None:
    # Groups of 6 need 2 cells of 4 slots. The balanced split (1 rollout cell: training is
    # expensive) would leave a pool where every group waits for slots; before executions could
    # start one by one, such a pool never admitted again and a 3-cell random workload stalled.
    config = replace(CONFIG, num_cells=3, group_size=6)
    stuck = replace(
        EMPTY, version=2, rollout_cells=1, training_cells=2, groups_admitted=2, queued_groups=4,
        training_starved_since_s=100.0, rollout_cell_s_per_group=1.0, training_cell_s_per_group=50.0,
    )  # fmt: skip
    # Grow the pool, and admit one group now: 4 of its executions start, 2 wait for a slot.
    assert elastic.decide(stuck, config) == Decision(admit=1, to_rollout=1)
    # The cell has switched; the 2 waiting executions took 2 of its slots, 2 slots are free.
    grown = replace(
        stuck, rollout_cells=2, training_cells=1, running=6, groups_admitted=3, queued_groups=3,
        running_groups=((2, 1),),
    )  # fmt: skip
    assert elastic.decide(grown, config) == Decision(admit=1)


def test_admission_fills_every_free_slot_and_lets_at_most_a_group_wait() -> None:
    assert groups_to_admit(admissible=5, free_slots=6, waiting=0, group_size=4) == 2  # 2 wait
    assert groups_to_admit(admissible=5, free_slots=6, waiting=3, group_size=4) == 1
    assert groups_to_admit(admissible=5, free_slots=2, waiting=2, group_size=4) == 0  # all taken
    assert groups_to_admit(admissible=1, free_slots=16, waiting=0, group_size=4) == 1  # the cap


def test_colocate_with_standalone_rollout_cells_keeps_only_those_while_training() -> None:
    # Step 0's two groups are ready; groups 2 and 3 (admitted ahead, within K=1) still run.
    view = replace(
        EMPTY, rollout_cells=8, training_cells=0, running=8, groups_admitted=4, queued_groups=16,
        running_groups=((0, 2),), ready=(ready(0, 0), ready(1, 0)),
    )  # fmt: skip
    assert colocate.decide(view, CONFIG, standalone_rollout_cells=2) == Decision(assign=(0, 1), to_training=6)


def test_colocate_admits_later_steps_only_into_the_standalone_cells_slots() -> None:
    # Step 0's groups are all admitted and running (8 executions); 2 standalone cells hold 8.
    view = replace(
        EMPTY, rollout_cells=8, training_cells=0, running=8, groups_admitted=2, queued_groups=18,
        running_groups=((0, 2),),
    )  # fmt: skip
    assert colocate.decide(view, CONFIG, standalone_rollout_cells=2) == Decision()
    assert colocate.decide(view, CONFIG, standalone_rollout_cells=3) == Decision(admit=1)


# -- end game --------------------------------------------------------------------------------------

# The last step (version 9 of 10): nothing queued, 3 rollout cells full with 4 executions waiting,
# training satellites busy with a step whose training is expensive (balanced split: 1-2 cells).
END = replace(
    EMPTY, version=9, rollout_cells=3, training_cells=5, running=12, waiting=4, groups_admitted=20,
    queued_groups=0, running_groups=((8, 2), (9, 2)), step_groups=1, step_untrained_tokens=50_000,
    training_cell_s_per_group=400.0,
)  # fmt: skip


def test_gyre_end_game_pulls_satellites_back_to_roll_out_long_executions() -> None:
    long_runs = replace(END, rollout_cell_s_per_group=100.0)  # mean execution 100 s > 1 x 12 s
    assert elastic.decide(long_runs, CONFIG).to_rollout == 1  # 16 executions need 4 cells
    assert elastic.decide(long_runs, CONFIG, ElasticKnobs(end_game=False)).to_rollout == 0


def test_gyre_end_game_keeps_training_cells_when_executions_are_short() -> None:
    short_runs = replace(END, rollout_cell_s_per_group=10.0)  # 10 s < one update and round trip
    assert elastic.decide(short_runs, CONFIG).to_rollout == 0


def test_burst_releases_a_burst_only_after_the_last_one_finished() -> None:
    running = replace(
        EMPTY, groups_admitted=2, queued_groups=18, running=4, running_groups=((0, 1),), ready=(ready(0, 0),)
    )
    assert burst.decide(running, CONFIG).admit == 0
    assert burst.decide(running, CONFIG).assign == ()
    done = replace(running, running=0, running_groups=(), ready=(ready(0, 0), ready(1, 0)))
    decision = burst.decide(done, CONFIG)
    assert decision.assign == (0, 1) and decision.admit == 2
