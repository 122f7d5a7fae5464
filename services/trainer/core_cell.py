"""The core cell's training state: weights, optimizer, data-parallel core, files (shell: torch, disk).

`open_core_cell` resumes from the last step the database recorded (its checkpoint), or starts
from the initial weights; a checkpoint on disk newer than that step is ignored (its step did
not commit and will be trained again from the same groups).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from services.trainer.checkpoint import checkpoint_folder, load_checkpoint
from services.trainer.config import TrainerSettings
from services.trainer.device import check_device, place
from services.trainer.dp import DataParallelCore
from services.trainer.policy import build_model, load_model, tiny_config
from services.trainer.steps import PolicyTrainer, make_optimizer
from services.trainer.weights import PublishedWeights, publish


def path_from_uri(uri: str) -> Path:
    parsed = urlparse(uri)
    return Path(parsed.path) if parsed.scheme == "file" else Path(uri)


@dataclass(slots=True, kw_only=True)
class CoreCell:
    trainer: PolicyTrainer
    core: DataParallelCore
    checkpoints_root: Path
    weights_root: Path
    weights_uri: str


def open_core_cell(
    settings: TrainerSettings, *, version: int, checkpoint_uri: str | None
) -> tuple[CoreCell, PublishedWeights | None]:
    """Load or create the weights; returns the cell and the weights published for version 0, if any."""
    root = settings.state_dir
    checkpoints_root = root / "checkpoints"
    weights_root = root / "weights"
    optim = settings.optim()
    device_plan = settings.device_plan()
    check_device(device_plan)
    if checkpoint_uri is not None:
        model, optimizer_state, saved = load_checkpoint(path_from_uri(checkpoint_uri))
        assert saved == version, f"checkpoint {checkpoint_uri} holds version {saved}, expected {version}"
        model = place(model, device_plan)
        optimizer = make_optimizer(model, optim)
        optimizer.load_state_dict(optimizer_state)
    else:
        model = place(
            load_model(settings.model_dir)
            if settings.model_dir
            else build_model(tiny_config(), seed=settings.seed),
            device_plan,
        )
        optimizer = make_optimizer(model, optim)
    for stale in checkpoints_root.glob("step-*"):  # uncommitted leftovers of a crash
        if stale.name > checkpoint_folder(checkpoints_root, version).name or not stale.name[5:].isdigit():
            shutil.rmtree(stale, ignore_errors=True)
    core = DataParallelCore(
        model_config=model.config,
        loss_config=optim.loss,
        host=settings.dp_host,
        port=settings.dp_port,
        cell_id=settings.cell_id,
        timeout_s=settings.dp_timeout_s,
        join_timeout_s=settings.dp_join_timeout_s,
        dead_after_s=settings.satellite_dead_after_s,
        max_attempts=settings.step_attempts,
        backend=device_plan.backend,
        autocast_bf16=device_plan.autocast_bf16,
    )
    trainer = PolicyTrainer(model, optimizer, optim, core, version=version, emulation=settings.emulation())
    published = publish(model, weights_root, version=version)
    return (
        CoreCell(
            trainer=trainer,
            core=core,
            checkpoints_root=checkpoints_root,
            weights_root=weights_root,
            weights_uri=published.source_uri,
        ),
        published if version == 0 else None,
    )
