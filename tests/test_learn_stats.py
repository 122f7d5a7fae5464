"""The learning run's figures: bootstrap intervals, paired gains, zero-advantage groups, task order (pure)."""

from __future__ import annotations

import pytest

from gyre_app.learn_run import task_order
from gyre_app.learn_stats import (
    bootstrap_mean,
    instance_means,
    paired_differences,
    pooled,
    zero_advantage_share,
)


def test_the_same_seed_gives_the_same_interval() -> None:
    values = [0.0, 0.25, 0.5, 0.5, 0.75, 1.0, 1.0, 0.0, 0.5, 0.25]
    a = bootstrap_mean(values, seed=3)
    assert a == bootstrap_mean(values, seed=3)
    assert a.mean == pytest.approx(0.475)
    assert a.low < a.mean < a.high and a.level == 0.9 and a.num_instances == 10


def test_the_interval_narrows_with_more_instances_and_vanishes_without_spread() -> None:
    few = bootstrap_mean([0.0, 1.0] * 4, seed=0)
    many = bootstrap_mean([0.0, 1.0] * 64, seed=0)
    assert many.high - many.low < few.high - few.low
    # The standard error of a mean of 128 coin flips is 0.044: a 90 % interval is about +-0.073.
    assert many.high - many.low == pytest.approx(2 * 1.645 * 0.5 / 128**0.5, rel=0.2)
    flat = bootstrap_mean([0.5] * 5, seed=0)
    assert (flat.low, flat.mean, flat.high) == (0.5, 0.5, 0.5)


def test_a_paired_gain_is_per_instance_and_refuses_unmatched_instances() -> None:
    after = {"b": [1.0, 0.5], "a": [1.0, 1.0]}
    before = {"a": [0.5, 0.5], "b": [0.5, 0.5]}
    assert paired_differences(after, before) == [0.5, 0.25]  # a, then b
    with pytest.raises(ValueError, match="unmatched: c"):
        paired_differences({**after, "c": [1.0]}, before)
    with pytest.raises(ValueError, match="without a sample: a"):
        instance_means({"a": []})
    assert pooled({"a": [1.0]}, {"a": [0.0]}) == {"0/a": [1.0], "1/a": [0.0]}


def test_a_gain_of_zero_has_an_interval_around_zero() -> None:
    diffs = [0.25, -0.25, 0.5, -0.5, 0.0, 0.0, 0.25, -0.25]
    gain = bootstrap_mean(diffs, seed=1)
    assert gain.mean == 0.0 and gain.low < 0.0 < gain.high
    assert gain.as_dict("g") == {"g": 0.0, "g_ci_low": round(gain.low, 4), "g_ci_high": round(gain.high, 4)}


def test_bad_input_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="no instances"):
        bootstrap_mean([], seed=0)
    with pytest.raises(ValueError, match="level must be in"):
        bootstrap_mean([1.0], seed=0, level=1.5)
    with pytest.raises(ValueError, match="no groups"):
        zero_advantage_share([])


def test_groups_whose_rewards_are_all_equal_count_as_teaching_nothing() -> None:
    assert zero_advantage_share([[0.5, 0.5, 0.5], [0.0, 1.0, 0.5], [1.0]]) == pytest.approx(2 / 3)
    assert zero_advantage_share([[0.0, 1.0], [0.5, 1.0]]) == 0.0


def test_training_tasks_are_revisited_epoch_after_epoch() -> None:
    pool = ["t0", "t1", "t2", "t3"]
    order = task_order(pool, 10, seed=5)
    assert order[:4] == pool  # the first epoch in the pool's order
    assert sorted(order[4:8]) == pool  # the second, every instance once, shuffled
    assert order == task_order(pool, 10, seed=5)
    assert {order.count(t) for t in pool} == {2, 3}
    with pytest.raises(ValueError, match="empty training pool"):
        task_order([], 3, seed=0)
