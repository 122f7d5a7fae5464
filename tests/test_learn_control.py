"""The control arm is the frozen warm start: the trainer's step at learning rate 0 leaves every
weight byte-identical (what `bench.learning` checks by digest at run time), while the same step
at the trained arm's rate moves them. Real trainer step (GRPO loss, AdamW with weight decay,
gradient clipping) on the tiny Qwen2 model, published and digested as the stack does."""

from __future__ import annotations

from pathlib import Path

import pytest

from gyre_app.learn_probe import weights_digest
from services.trainer.dp import DataParallelCore
from services.trainer.loss import LossConfig
from services.trainer.policy import build_model, tiny_config
from services.trainer.steps import OptimConfig, PolicyTrainer, make_optimizer
from services.trainer.synthetic import synthetic_executions
from services.trainer.weights import publish


@pytest.mark.parametrize(("learning_rate", "unchanged"), [(0.0, True), (2e-4, False)])
def test_a_step_at_learning_rate_0_leaves_the_published_weights_byte_identical(
    tmp_path: Path, learning_rate: float, unchanged: bool
) -> None:
    model = build_model(tiny_config(), seed=0)
    config = OptimConfig(learning_rate=learning_rate, max_grad_norm=1.0, loss=LossConfig())
    core = DataParallelCore(model_config=model.config, loss_config=config.loss, port=0, cell_id="control")
    trainer = PolicyTrainer(model, make_optimizer(model, config), config, core, version=0)
    v0 = weights_digest(publish(model, tmp_path, version=0).folder)
    samples = synthetic_executions(
        seed=1,
        num_executions=2,
        trajectories_per_execution=2,
        stem_tokens=16,
        branch_tokens=8,
        vocab_size=512,
        rewards=[0.0, 1.0],  # advantages not all zero: the gradient is not 0
    )
    reports = [trainer.step(samples)]
    core.store = None  # type: ignore[assignment]  # close the TCPStore with the core
    assert all(r.grad_norm > 0 for r in reports), reports  # a real gradient each step
    v1 = weights_digest(publish(model, tmp_path, version=1).folder)
    assert (v1 == v0) is unchanged
