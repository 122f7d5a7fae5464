"""A forced staleness drop: the remaining samples' loss weights follow DESIGN section 4 exactly
(per execution, a shared target counted once, E counting only executions that still contribute)."""

from __future__ import annotations

import dataclasses

import pytest
from trainer_builders import tiny_model, tree_samples

from services.trainer.reweigh import reweigh
from services.trainer.samples import Sample, StalenessAction, admit


def counted_positions(samples: list[Sample] | tuple[Sample, ...]) -> dict[str, list[tuple[int, ...]]]:
    """Per execution, the tree positions (token prefixes) its samples count as targets."""
    out: dict[str, list[tuple[int, ...]]] = {}
    for s in samples:
        for t, (m, w) in enumerate(zip(s.loss_mask, s.token_weight, strict=True)):
            if m and w > 0:
                out.setdefault(s.execution_id, []).append(s.token_ids[: t + 1])
    return out


def expected_weights(
    original: list[Sample], kept: tuple[Sample, ...]
) -> dict[str, tuple[set[tuple[int, ...]], float]]:
    """The rule, computed from scratch: targets that still appear in a kept sample, 1/(E*U_e) each."""
    targets = {e: set(p) for e, p in counted_positions(original).items()}
    remaining: dict[str, set[tuple[int, ...]]] = {}
    for s in kept:
        prefixes = {s.token_ids[: t + 1] for t in range(len(s.token_ids))}
        remaining.setdefault(s.execution_id, set()).update(targets.get(s.execution_id, set()) & prefixes)
    live = {e: p for e, p in remaining.items() if p}
    return {e: (p, 1.0 / (len(live) * len(p))) for e, p in live.items()}


def stale(sample: Sample) -> Sample:
    return dataclasses.replace(sample, policy_versions=tuple(0 for _ in sample.token_ids))


def fresh(sample: Sample) -> Sample:
    return dataclasses.replace(sample, policy_versions=tuple(5 for _ in sample.token_ids))


def check_rule(original: list[Sample], kept: tuple[Sample, ...]) -> None:
    expected = expected_weights(original, kept)
    got = counted_positions(kept)
    assert {e: sorted(p) for e, p in got.items()} == {e: sorted(p) for e, (p, _) in expected.items()}
    for s in kept:
        for t, w in enumerate(s.token_weight):
            if s.token_ids[: t + 1] in expected[s.execution_id][0] and w:
                assert w == pytest.approx(expected[s.execution_id][1])
    assert sum(sum(s.token_weight) for s in kept) == pytest.approx(1.0)


def test_dropping_the_sample_that_counted_a_shared_stem_moves_the_stem_to_a_kept_sample() -> None:
    samples = [fresh(s) for s in tree_samples(tiny_model(), num_executions=2)]
    first = samples[0]
    assert first.trajectory_id == "exec-0/traj-0"
    assert len(counted_positions([first])["exec-0"]) > len(counted_positions([samples[1]])["exec-0"])
    forced = [stale(first), *samples[1:]]
    admission = admit(forced, trainer_version=5, max_staleness_steps=2, action=StalenessAction.DROP)
    assert admission.num_dropped == 1
    kept = reweigh(admission.kept, admission.dropped)
    check_rule(samples, kept)
    stem = counted_positions([first])["exec-0"][0]
    assert stem in counted_positions(kept)["exec-0"]  # the shared stem still trains, once


def test_an_execution_with_every_sample_dropped_leaves_e() -> None:
    samples = [fresh(s) for s in tree_samples(tiny_model(), num_executions=2)]
    forced = [stale(s) if s.execution_id == "exec-1" else s for s in samples]
    admission = admit(forced, trainer_version=5, max_staleness_steps=2, action=StalenessAction.DROP)
    kept = reweigh(admission.kept, admission.dropped)
    assert {s.execution_id for s in kept} == {"exec-0"}
    check_rule(samples, kept)  # exec-0 alone: its weights sum to 1, not 1/2


def test_without_a_drop_the_trajectory_services_weights_already_follow_the_rule() -> None:
    samples = [fresh(s) for s in tree_samples(tiny_model(), num_executions=3)]
    check_rule(samples, tuple(samples))
    assert reweigh(samples, ()) == tuple(samples)
