"""Builders shared by the trainer tests: a tiny model and samples whose old logprobs are its own."""

from __future__ import annotations

import dataclasses

import torch
from transformers import PreTrainedModel

from services.trainer.policy import build_model, flat_logprobs, tiny_config
from services.trainer.samples import Sample
from services.trainer.synthetic import synthetic_executions


def tiny_model(seed: int = 0) -> PreTrainedModel:
    torch.set_num_threads(1)
    return build_model(tiny_config(vocab_size=256, hidden_size=32), seed=seed)


def on_policy(samples: list[Sample], model: PreTrainedModel, *, shift: float = 0.05) -> list[Sample]:
    """Replace old_logprobs by the model's own (minus `shift`, so ratios sit just above 1)."""
    with torch.no_grad():
        out = []
        for s in samples:
            lp = flat_logprobs(model, [s.token_ids]).tolist()
            old = (0.0, *(v - shift if m else 0.0 for v, m in zip(lp, s.loss_mask[1:], strict=True)))
            out.append(dataclasses.replace(s, old_logprobs=old))
    return out


def tree_samples(model: PreTrainedModel, *, seed: int = 1, num_executions: int = 3) -> list[Sample]:
    samples = synthetic_executions(
        seed=seed,
        num_executions=num_executions,
        trajectories_per_execution=3,
        stem_tokens=40,
        branch_tokens=12,
        vocab_size=256,
    )
    return on_policy(samples, model)
