"""One optimizer step: staleness admission, microbatches across members, clipping, AdamW (torch).

`PolicyTrainer` holds the authoritative weights and the optimizer of the core cell. `step`
takes the samples of B groups, drops or refuses stale ones as configured (and reports them),
has the data-parallel members compute the summed gradient, and applies it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from services.trainer.batch_digest import batch_sha256
from services.trainer.dp import DataParallelCore
from services.trainer.dp.emulated import emulated_step
from services.trainer.loss import LossConfig
from services.trainer.microbatch import flat_parameters, plan_microbatches
from services.trainer.reweigh import reweigh
from services.trainer.samples import Admission, Sample, StalenessAction, admit, check_context, validate_sample


@dataclass(frozen=True, slots=True, kw_only=True)
class OptimConfig:
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    microbatch_max_tokens: int = 4096
    max_sample_tokens: int = 65536
    """The longest trajectory trained (alone in its microbatch when over `microbatch_max_tokens`)."""
    max_staleness_steps: int = 4
    staleness_action: StalenessAction = StalenessAction.DROP
    loss: LossConfig = field(default_factory=LossConfig)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepReport:
    version: int
    num_samples: int
    num_dropped_stale: int
    num_target_tokens: int
    num_microbatches: int
    staleness_mean_steps: float
    staleness_max_steps: int
    loss: float
    grad_norm: float
    max_dp_world_size: int
    duration_s: float
    attempts: int = 1
    """More than 1: a satellite died mid-step and the step was computed again without it."""
    lost_cells: tuple[str, ...] = ()
    batch_sha256: str = ""
    """`batch_digest.batch_sha256` of the samples trained on (after staleness admission)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatedCompute:
    """EMULATION ONLY (an emulated cluster, `bench.cell_rig`): a step audits its batch as always (validation,
    staleness admission, re-weighing, microbatch plan, batch digest) but spends modelled time in
    place of the forward and backward passes and leaves the weights as they are: the version
    still advances and is published, so engines and the scheduler see real versions."""

    tokens_per_s: float
    """One cell's modelled training rate (a profile's `training_tokens_per_s_per_cell`)."""
    gradient_bytes: float = 0.0
    """Bytes one replica all-reduces (its weights' size in the training dtype)."""
    link_bytes_per_s: float = 1.0
    time_scale: float = 1.0

    def compute_s(self, num_tokens: int) -> float:
        """Example: 24,000 tokens at 24,000 tokens/s, time_scale 10 -> 0.1 s"""
        return num_tokens / self.tokens_per_s / self.time_scale

    def allreduce_s(self, replicas: int) -> float:
        """A ring all-reduce: 2 (n - 1) / n of the gradients cross each cell's link."""
        if replicas <= 1:
            return 0.0
        return 2.0 * (replicas - 1) / replicas * self.gradient_bytes / self.link_bytes_per_s / self.time_scale


def make_optimizer(model: PreTrainedModel, config: OptimConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        flat_parameters(model), lr=config.learning_rate, weight_decay=config.weight_decay
    )


class PolicyTrainer:
    def __init__(
        self,
        model: PreTrainedModel,
        optimizer: torch.optim.Optimizer,
        config: OptimConfig,
        core: DataParallelCore,
        *,
        version: int,
        emulation: EmulatedCompute | None = None,
    ) -> None:
        self.emulation = emulation
        self.model = model
        self.optimizer = optimizer
        self.config = config
        self.core = core
        self.version = version
        core.current_version = version

    @property
    def max_sample_tokens(self) -> int:
        """The longest trajectory this trainer trains: its setting, cut to the model's context."""
        context = getattr(self.model.config, "max_position_embeddings", None)
        limit = self.config.max_sample_tokens
        return min(limit, int(context)) if context else limit

    def step(
        self, samples: Sequence[Sample], *, after_microbatch: Callable[[int], None] | None = None
    ) -> StepReport:
        started = time.perf_counter()
        for i, s in enumerate(samples):
            validate_sample(s, field=f"samples[{i}]")
        context = getattr(self.model.config, "max_position_embeddings", None)
        if context:
            check_context(samples, max_context_tokens=int(context))
        admission = admit(
            samples,
            trainer_version=self.version,
            max_staleness_steps=self.config.max_staleness_steps,
            action=self.config.staleness_action,
        )
        # A drop is the last resort (admission bounds staleness): what remains is weighed afresh.
        kept = reweigh(admission.kept, admission.dropped) if admission.dropped else admission.kept
        microbatches = plan_microbatches(
            kept, max_tokens=self.config.microbatch_max_tokens, max_sample_tokens=self.max_sample_tokens
        )
        if self.emulation is not None:
            return self._emulated_step(kept, admission, microbatches, started)
        self.model.train()
        gradient = self.core.compute_step_gradient(
            self.model, microbatches, version=self.version + 1, after_microbatch=after_microbatch
        )
        params = flat_parameters(self.model)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = gradient.grad_P[offset : offset + n].view_as(p).to(p.dtype).clone()
            offset += n
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.version += 1
        self.core.current_version = self.version
        return StepReport(
            version=self.version,
            num_samples=len(kept),
            num_dropped_stale=admission.num_dropped,
            num_target_tokens=gradient.num_targets,
            num_microbatches=gradient.num_microbatches,
            staleness_mean_steps=admission.staleness_mean_steps,
            staleness_max_steps=admission.staleness_max_steps,
            loss=gradient.loss,
            grad_norm=grad_norm,
            max_dp_world_size=gradient.max_world_size,
            duration_s=time.perf_counter() - started,
            attempts=gradient.attempts,
            lost_cells=gradient.lost_cells,
            batch_sha256=batch_sha256(admission.kept),
        )

    def _emulated_step(
        self,
        kept: Sequence[Sample],
        admission: Admission,
        microbatches: Sequence[Sequence[Sample]],
        started: float,
    ) -> StepReport:
        """The step of an emulated cluster: audited like any other, timed by the model, no arithmetic."""
        assert self.emulation is not None
        tokens = [sum(len(s.token_ids) for s in mb) for mb in microbatches]
        widest = emulated_step(self.core, tokens, version=self.version + 1, timing=self.emulation)
        self.version += 1
        self.core.current_version = self.version
        return StepReport(
            version=self.version,
            num_samples=len(kept),
            num_dropped_stale=admission.num_dropped,
            num_target_tokens=sum(s.num_targets for s in kept),
            num_microbatches=len(microbatches),
            staleness_mean_steps=admission.staleness_mean_steps,
            staleness_max_steps=admission.staleness_max_steps,
            loss=0.0,
            grad_norm=0.0,
            max_dp_world_size=widest,
            duration_s=time.perf_counter() - started,
            batch_sha256=batch_sha256(admission.kept),
        )
