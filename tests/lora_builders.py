"""Builders shared by the LoRA tests: a tiny base written as the trainer writes it, with adapters."""

from __future__ import annotations

from pathlib import Path

import torch
from trainer_builders import tiny_model, tree_samples
from transformers import PreTrainedModel

from services.trainer.dp import DataParallelCore
from services.trainer.lora import BaseRef, LoraSpec, attach_lora, lora_spec_of
from services.trainer.steps import OptimConfig, PolicyTrainer, make_optimizer
from services.trainer.weights import write_base_folder

SPEC = LoraSpec(rank=4, alpha=8.0, target_modules=("o_proj", "q_proj", "up_proj", "v_proj"))
PROMPT_IDS = [[3, 17, 42, 99, 5, 61, 8], [7, 7, 120, 33, 2, 9, 200]]


def lora_model(root: Path, *, spec: LoraSpec = SPEC) -> tuple[PreTrainedModel, BaseRef]:
    """The tiny model's weights written as the run's base, then the adapters attached."""
    model = tiny_model()
    base = write_base_folder(model, root / "base")
    return attach_lora(model, spec, seed=0), base


def lora_trainer(
    model: PreTrainedModel, *, base: BaseRef, learning_rate: float = 3e-2, timeout_s: float = 60.0
) -> PolicyTrainer:
    config = OptimConfig(learning_rate=learning_rate)
    core = DataParallelCore(
        model_config=model.config,
        loss_config=config.loss,
        lora=lora_spec_of(model),
        base_folder=base.folder,
        timeout_s=timeout_s,
        join_timeout_s=timeout_s,
    )
    return PolicyTrainer(model, make_optimizer(model, config), config, core, version=0)


def train_steps(trainer: PolicyTrainer, steps: int) -> None:
    """`steps` real optimizer steps, each on samples the current policy generated."""
    for seed in range(steps):
        trainer.step(tree_samples(trainer.model, seed=seed + 1, num_executions=2))


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = model.eval()(input_ids=torch.tensor(PROMPT_IDS)).logits
    return out
