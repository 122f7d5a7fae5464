"""Trainer core: tree packing equals separate sequences (loss and gradients), staleness, weights."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from trainer_builders import tiny_model, tree_samples

from services.trainer.loss import LossConfig
from services.trainer.microbatch import microbatch_gradient, plan_microbatches
from services.trainer.packing import pack_sequences, tree_attention_mask
from services.trainer.samples import StalenessAction, StalenessExceeded, admit
from services.trainer.weights import publish


def test_pack_shares_prefixes_and_masks_ancestors_only() -> None:
    tree = pack_sequences([[1, 2, 3, 100], [1, 2, 3, 101, 102], [1, 2, 7]])
    assert tree.token_ids == (1, 2, 3, 100, 101, 102, 7)
    assert tree.parent == (-1, 0, 1, 2, 2, 4, 1)
    assert tree.position_ids == (0, 1, 2, 3, 3, 4, 2)
    assert tree.num_flat_tokens == 12
    mask = tree_attention_mask(tree)
    assert mask[5].tolist() == [True, True, True, False, True, True, False]  # 102 sees 1 2 3 101 102
    assert mask[6].tolist() == [True, True, False, False, False, False, True]


def test_tree_packed_loss_and_gradients_equal_separate_sequences() -> None:
    model = tiny_model()
    samples = tree_samples(model, num_executions=2)
    config = LossConfig(kl_coef=0.1)
    for mb in plan_microbatches(samples, max_tokens=10_000):
        packed = microbatch_gradient(model, mb, config, packed=True)
        flat = microbatch_gradient(model, mb, config, packed=False)
        assert packed.stats.loss == pytest.approx(flat.stats.loss, rel=1e-5, abs=1e-7)
        scale = flat.grad_P.abs().max()
        assert scale > 0
        assert float((packed.grad_P - flat.grad_P).abs().max() / scale) <= 1e-5


def test_microbatches_keep_executions_together_within_the_budget() -> None:
    samples = tree_samples(tiny_model(), num_executions=2)  # 3 samples of 52 tokens, 40 shared
    plan = plan_microbatches(samples, max_tokens=70)  # packed: 52 + 12 fit, a third 12 does not
    assert [[s.trajectory_id for s in mb] for mb in plan] == [
        ["exec-0/traj-0", "exec-0/traj-1"],
        ["exec-0/traj-2"],
        ["exec-1/traj-0", "exec-1/traj-1"],
        ["exec-1/traj-2"],
    ]


def test_stale_samples_are_dropped_and_counted_or_refused() -> None:
    samples = tree_samples(tiny_model(), num_executions=1)
    aged = [
        dataclasses.replace(s, policy_versions=tuple(v for v in (i,) * len(s.token_ids)))
        for i, s in enumerate(samples)
    ]
    kept = admit(aged, trainer_version=3, max_staleness_steps=2, action=StalenessAction.DROP)
    assert [s.trajectory_id for s in kept.kept] == ["exec-0/traj-1", "exec-0/traj-2"]
    assert kept.num_dropped == 1
    assert kept.staleness_max_steps == 3
    assert kept.staleness_mean_steps == pytest.approx((3 + 2 + 1) / 3)
    with pytest.raises(StalenessExceeded, match=r"exec-0/traj-0 .* 3 versions stale"):
        admit(aged, trainer_version=3, max_staleness_steps=2, action=StalenessAction.FAIL)


def test_published_weights_use_the_state_dict_names(tmp_path: Path) -> None:
    model = tiny_model()
    published = publish(model, tmp_path, version=7)
    assert published.folder.name == "v00000007"
    assert published.source_uri.startswith("file://")
    tensors = load_file(published.folder / "model.safetensors")
    state = model.state_dict()
    assert set(tensors) == set(state)
    assert torch.equal(tensors["model.embed_tokens.weight"], state["model.embed_tokens.weight"])
    assert (published.folder / "config.json").exists()
