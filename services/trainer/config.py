"""Trainer settings, env prefix GYRE_TRAINER_ (shell)."""

from __future__ import annotations

from pathlib import Path

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.trainer.device import DevicePlan
from services.trainer.lora import LoraSpec
from services.trainer.loss import LossConfig
from services.trainer.samples import StalenessAction
from services.trainer.steps import EmulatedCompute, OptimConfig


class TrainerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYRE_TRAINER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 0
    """gRPC port; 0 picks a free one."""
    cell_id: str = "cell-0"
    """The core cell this trainer runs on."""
    dp_host: str = "127.0.0.1"
    """Where the data-parallel rendezvous store listens (satellites connect here)."""
    dp_port: int = 0
    state_dir: Path = Path(".gyre/trainer")
    """Checkpoints in `checkpoints/`, published weights in `weights/`."""
    model_dir: Path | None = None
    """Initial weights (`gyre model init DIR`); unset: a tiny Qwen2 model from `seed`."""
    seed: int = 0
    trajectory_address: str = "127.0.0.1:50055"
    steps_from_scheduler: bool = False
    """Take each step's groups as the scheduler assigned them (`StepAssigned`, earliest deadline
    first) instead of in arrival order; the live stack sets it."""
    groups_per_step: int = 4
    """B: a step as soon as B groups are ready, in arrival order. Which groups are admitted, and
    when (streaming, bursts, batches), is the scheduler's policy, not the trainer's."""
    j_max: int = 5
    learning_rate: float = 1e-3
    max_grad_norm: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0
    microbatch_max_tokens: int = 4096
    trajectory_max_tokens: int = 65536
    """The longest trajectory trained. One longer than `microbatch_max_tokens` trains in a
    microbatch of its own (tree attention's memory is linear in the tokens); one longer than this
    (or than the model's context) sets its group aside with the reason (`GroupSetAside`)."""
    max_staleness_steps: int = 4
    staleness_action: StalenessAction = StalenessAction.DROP
    keep_checkpoints: int = 3
    dp_timeout_s: float = 120.0
    dp_join_timeout_s: float = 20.0
    """A satellite that does not take up its epoch this long after the core opened it is dropped
    (the join fails in this time, not in `dp_timeout_s`)."""
    satellite_dead_after_s: float = 5.0
    """A satellite whose heartbeat is silent this long is lost: the step is computed again without it."""
    step_attempts: int = 3
    """Attempts of one step before it fails (each lost satellite costs one)."""
    max_group_attempts: int = 3
    """Steps tried with a group (that failed on an error of the step, or with the trainer dying)
    before the group is set aside with the reason (`GroupSetAside`) instead of tried forever."""
    device: str = "cpu"
    """Torch device of the core cell: cpu, cuda, cuda:1 (CUDA: NCCL groups; not yet run on a GPU)."""
    autocast_bf16: bool = False
    """Forward passes under bf16 autocast (float32 weights, float32 loss, float64 reductions)."""
    emulated_tokens_per_s: float = 0.0
    """EMULATION ONLY: above 0, a step audits its batch but spends tokens / this many seconds
    (divided by `emulated_time_scale`) instead of computing, and the weights stay as they are
    (an emulated cluster; the profile's training rate). 0: real arithmetic."""
    emulated_time_scale: float = 1.0
    """EMULATION ONLY: the modelled step time is divided by this (the cluster's time scale)."""
    emulated_gradient_bytes: float = 0.0
    """EMULATION ONLY: bytes one replica all-reduces per epoch (a profile's weight bytes)."""
    emulated_link_bytes_per_s: float = 4.0e11
    """EMULATION ONLY: one cell's link for the all-reduce (a profile's `cell.link_bytes_per_s`)."""

    def emulation(self) -> EmulatedCompute | None:
        if self.emulated_tokens_per_s <= 0:
            return None
        return EmulatedCompute(
            tokens_per_s=self.emulated_tokens_per_s,
            gradient_bytes=self.emulated_gradient_bytes,
            link_bytes_per_s=self.emulated_link_bytes_per_s,
            time_scale=self.emulated_time_scale,
        )

    lora: bool = False
    """Train LoRA adapters instead of every weight: the base is frozen, the optimizer holds the
    adapter alone, and engines and satellites receive the adapter alone (needs `gyre[lora]`)."""
    lora_rank: int = 8
    """r, the adapters' rank (above 0)."""
    lora_alpha: float = 16.0
    """The adapters' scale is lora_alpha / lora_rank (above 0)."""
    lora_dropout: float = 0.0
    """Dropout on the adapters' input while training, in [0, 1). Above 0 a step's gradient
    depends on the dropout draws, so data-parallel members no longer reproduce each other."""
    lora_target_modules: str = "q_proj,k_proj,v_proj,o_proj"
    """Comma-separated names of the linear layers to adapt (the last part of a module's path);
    one the model does not have is refused at start, with the names it has."""

    @field_validator("lora_rank")
    @classmethod
    def _rank_positive(cls, v: int) -> int:
        if v <= 0:
            raise ValueError(f"GYRE_TRAINER_LORA_RANK must be above 0, got {v}")
        return v

    @field_validator("lora_alpha")
    @classmethod
    def _alpha_positive(cls, v: float) -> float:
        if not v > 0:
            raise ValueError(f"GYRE_TRAINER_LORA_ALPHA must be above 0, got {v}")
        return v

    @field_validator("lora_dropout")
    @classmethod
    def _dropout_fraction(cls, v: float) -> float:
        if not 0.0 <= v < 1.0:
            raise ValueError(f"GYRE_TRAINER_LORA_DROPOUT must be in [0, 1), got {v}")
        return v

    @field_validator("lora_target_modules")
    @classmethod
    def _targets_named(cls, v: str) -> str:
        names = [t.strip() for t in v.split(",")]
        if not all(names) or any(not t.isidentifier() for t in names):
            raise ValueError(
                f"GYRE_TRAINER_LORA_TARGET_MODULES must be comma-separated layer names "
                f"such as q_proj,v_proj, got {v!r}"
            )
        return ",".join(names)

    def lora_spec(self) -> LoraSpec | None:
        """The adapters' configuration, or None when LoRA is off (every weight trains)."""
        if not self.lora:
            return None
        return LoraSpec(
            rank=self.lora_rank,
            alpha=self.lora_alpha,
            dropout=self.lora_dropout,
            target_modules=tuple(sorted(set(self.lora_target_modules.split(",")))),
        )

    def device_plan(self) -> DevicePlan:
        return DevicePlan(device=self.device, autocast_bf16=self.autocast_bf16)

    def optim(self) -> OptimConfig:
        return OptimConfig(
            learning_rate=self.learning_rate,
            max_grad_norm=self.max_grad_norm,
            microbatch_max_tokens=self.microbatch_max_tokens,
            max_sample_tokens=self.trajectory_max_tokens,
            max_staleness_steps=self.max_staleness_steps,
            staleness_action=self.staleness_action,
            loss=LossConfig(clip_low=self.clip_low, clip_high=self.clip_high, kl_coef=self.kl_coef),
        )
