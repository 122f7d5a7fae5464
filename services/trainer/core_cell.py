"""The core cell's training state: weights, optimizer, data-parallel core, files (shell: torch, disk).

`open_core_cell` resumes from the last step the database recorded (its checkpoint), or starts
from the initial weights; a checkpoint on disk newer than that step is ignored (its step did
not commit and will be trained again from the same groups).

A LoRA run (`GYRE_TRAINER_LORA`) writes the base weights once to `<state>/base` at its start and
attaches the adapters; its checkpoints, published versions and satellites carry the adapter
alone, each naming that base.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from gyre.errors import InvalidArgument
from services.trainer.checkpoint import checkpoint_folder, load_checkpoint
from services.trainer.config import TrainerSettings
from services.trainer.device import check_device, place
from services.trainer.dp import DataParallelCore
from services.trainer.lora import (
    BaseRef,
    attach_lora,
    check_targets,
    is_adapter_folder,
    lora_spec_of,
    peft_config,
)
from services.trainer.policy import build_model, load_model, tiny_config
from services.trainer.steps import PolicyTrainer, make_optimizer
from services.trainer.weights import PublishedWeights, publish, write_base_folder


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
    base: BaseRef | None = None
    """LoRA: the frozen base weights the adapter applies to; None when every weight trains."""


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
    lora = settings.lora_spec()
    base: BaseRef | None = None
    if checkpoint_uri is not None:
        folder = path_from_uri(checkpoint_uri)
        model, optimizer_state, saved = load_checkpoint(folder)
        assert saved == version, f"checkpoint {checkpoint_uri} holds version {saved}, expected {version}"
        if lora_spec_of(model) != lora:
            raise InvalidArgument(
                "GYRE_TRAINER_LORA",
                f"the run's checkpoint of step {version} has LoRA {lora_spec_of(model)}, the settings "
                f"ask for {lora}; resume with the run's own LoRA settings",
            )
        base = BaseRef.read(folder) if is_adapter_folder(folder) else None
        model = place(model, device_plan)
        optimizer = make_optimizer(model, optim)
        optimizer.load_state_dict(optimizer_state)
    else:
        model = (
            load_model(settings.model_dir)
            if settings.model_dir
            else build_model(tiny_config(), seed=settings.seed)
        )
        if lora is not None:
            peft_config(lora)  # before anything is written: refused at start (peft missing,
            check_targets(model, lora)  # or a target the model does not have)
            base = write_base_folder(model, root / "base")
            model = attach_lora(model, lora, seed=settings.seed)
        model = place(model, device_plan)
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
        lora=lora,
        base_folder=base.folder if base else None,
    )
    trainer = PolicyTrainer(model, optimizer, optim, core, version=version, emulation=settings.emulation())
    published = publish(model, weights_root, version=version, base=base)
    return (
        CoreCell(
            trainer=trainer,
            core=core,
            checkpoints_root=checkpoints_root,
            weights_root=weights_root,
            weights_uri=published.source_uri,
            base=base,
        ),
        published if version == 0 else None,
    )
