"""Checkpoints: weights, optimizer state and version, written atomically (shell: writes files).

A checkpoint is a folder `step-<version>` with the model folder layout (`config.json`,
`model.safetensors`), `optimizer.pt` and `meta.json`; in a LoRA run the model files are the
adapter's (`adapter_model.safetensors`, `adapter_config.json`, `gyre_base.json`: see `lora`),
since the base weights are frozen and written once, beside the checkpoints. It is complete or
absent: written under a temporary name and renamed. The database, not the folder, says which
step completed (the step's row commits after its checkpoint exists), so a checkpoint newer than
the database is ignored and its step is trained again from the same groups.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from services.trainer.lora import (
    BaseRef,
    attach_lora,
    is_adapter_folder,
    load_adapter_tensors,
    lora_spec_of,
    read_adapter_folder,
    write_adapter_files,
)
from services.trainer.policy import load_model
from services.trainer.weights import write_model_folder


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedCheckpoint:
    version: int
    folder: Path
    size_bytes: int

    @property
    def uri(self) -> str:
        return self.folder.resolve().as_uri()


def checkpoint_folder(root: Path, version: int) -> Path:
    return root / f"step-{version:08d}"


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def save_checkpoint(
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    folder: Path,
    *,
    version: int,
    base: BaseRef | None = None,
) -> SavedCheckpoint:
    """`base`: the frozen base weights of a model with LoRA attached (required then)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.with_name(folder.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    if lora_spec_of(model) is not None:
        assert base is not None, "a LoRA checkpoint names the base its adapter applies to"
        staging.mkdir()
        write_adapter_files(model, staging, base)
    else:
        write_model_folder(model, staging)
    torch.save(optimizer.state_dict(), staging / "optimizer.pt")
    (staging / "meta.json").write_text(json.dumps({"version": version}))
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return SavedCheckpoint(version=version, folder=folder, size_bytes=folder_size(folder))


def load_checkpoint(folder: Path) -> tuple[PreTrainedModel, dict[str, object], int]:
    """The model, the optimizer's state dict and the version saved in `folder`."""
    meta = json.loads((folder / "meta.json").read_text())
    if is_adapter_folder(folder):
        spec, tensors, base = read_adapter_folder(folder)
        model = attach_lora(load_model(base.folder), spec, seed=0)  # A's init is overwritten
        load_adapter_tensors(model, tensors)
    else:
        model = load_model(folder)
    optimizer_state = torch.load(folder / "optimizer.pt", weights_only=True)
    return model, optimizer_state, int(meta["version"])


def prune_checkpoints(root: Path, *, keep: int) -> None:
    for old in sorted(p for p in root.glob("step-*") if p.is_dir() and "." not in p.name)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
