"""Supervised fine-tuning of the tiny model on scripted transcripts, through the trainer's step (shell).

No training loop of its own: each step hands a batch of transcripts as trainer samples to
`PolicyTrainer.step` (the core cell's step: validation, microbatches, the data-parallel core,
gradient clipping, AdamW) with the loss in `supervised` mode.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from gyre_app.warmstart.tokens import RenderedChain, supervised_samples
from services.trainer.dp import DataParallelCore
from services.trainer.loss import SUPERVISED, LossConfig
from services.trainer.steps import OptimConfig, PolicyTrainer, make_optimizer


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    steps: int = 70
    """Enough passes (about five over the default transcripts) that the minority demonstrations
    (stopping early, wandering) are sampled near their share; at 40 a wander in 30 % of the
    demonstrations ran out of a 3-turn budget in 0 of 32 sampled runs, at 70 in 5 of 32 (temperature 0.7)."""
    transcripts_per_step: int = 8
    learning_rate: float = 3e-3
    final_learning_rate: float = 3e-4
    """Cosine decay from `learning_rate` to this over the steps."""
    threads: int = 1
    """The tiny model's matrices are too small for a second thread to pay: on a busy 2-core machine
    two threads made a step 10x slower in CPU time (spinning), one thread is never worse."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainReport:
    steps: int
    loss_first: float
    loss_last: float
    duration_s: float


def fine_tune(
    model: PreTrainedModel,
    transcripts: Sequence[Sequence[RenderedChain]],
    *,
    config: TrainConfig,
    seed: int,
    progress: Callable[[int, float], None] = lambda step, loss: None,
) -> TrainReport:
    """`config.steps` supervised steps on seeded batches of `transcripts`; trains `model` in place."""
    torch.manual_seed(seed)
    torch.set_num_threads(config.threads)
    rng = random.Random(seed)
    optim = OptimConfig(
        learning_rate=config.learning_rate,
        max_grad_norm=1.0,
        loss=LossConfig(mode=SUPERVISED),
    )
    core = DataParallelCore(model_config=model.config, loss_config=optim.loss, port=0, cell_id="warm-start")
    trainer = PolicyTrainer(model, make_optimizer(model, optim), optim, core, version=0)
    started = time.perf_counter()
    losses: list[float] = []
    order: list[int] = []
    for step in range(config.steps):
        lr = config.final_learning_rate + 0.5 * (config.learning_rate - config.final_learning_rate) * (
            1 + torch.cos(torch.tensor(torch.pi * step / max(1, config.steps))).item()
        )
        for group in trainer.optimizer.param_groups:
            group["lr"] = lr
        batch = []
        for _ in range(config.transcripts_per_step):
            if not order:  # epochs over a seeded shuffle: every transcript is seen as often
                order = list(range(len(transcripts)))
                rng.shuffle(order)
            batch.append(order.pop())
        samples = supervised_samples(
            [transcripts[i] for i in batch],
            names=[f"t{i}" for i in batch],
            version=trainer.version,
            pack_as=f"step-{step}",  # one tree: the shared system prompt is computed once a step
        )
        report = trainer.step(samples)
        losses.append(report.loss)
        progress(step, report.loss)
    core.store = None  # type: ignore[assignment]  # close the TCPStore with the core
    model.train(False)
    return TrainReport(
        steps=config.steps,
        loss_first=losses[0] if losses else 0.0,
        loss_last=sum(losses[-10:]) / len(losses[-10:]) if losses else 0.0,
        duration_s=time.perf_counter() - started,
    )
