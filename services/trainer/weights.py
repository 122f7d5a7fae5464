"""Weight publishing: a folder engines load with `UpdateWeights(version, source)` (shell: writes files).

The folder holds `config.json` and `model.safetensors` with the transformers state-dict names,
exactly what `save_pretrained` writes, so the torch engine and vLLM load it unchanged. A LoRA run
publishes the adapter alone instead (`adapter_model.safetensors`, `adapter_config.json` and
`gyre_base.json` naming the frozen base, see `lora`): that is the whole update an engine
receives, and the event's `size_bytes` is the adapter's. It is written under a temporary name
and renamed, so an engine never sees half a version.
On GPUs the same version would instead be broadcast from the core's GPU memory to the rollout
engines over NCCL (or RDMA), and `source_uri` would name that group; the event is the same.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedModel

from services.trainer.lora import ADAPTER_FILE, BaseRef, lora_spec_of, write_adapter_files

WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True, slots=True, kw_only=True)
class PublishedWeights:
    version: int
    folder: Path
    source_uri: str
    sha256: str
    size_bytes: int


def version_folder(root: Path, version: int) -> Path:
    return root / f"v{version:08d}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_model_folder(model: PreTrainedModel, folder: Path) -> None:
    """`save_pretrained` into `folder` atomically (temporary sibling, then rename)."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def write_base_folder(model: PreTrainedModel, folder: Path) -> BaseRef:
    """The base weights (before LoRA is attached) as a model folder, atomically; its reference."""
    write_model_folder(model, folder)
    return BaseRef(folder=folder, sha256=file_sha256(folder / WEIGHTS_FILE))


def write_adapter_folder(model: PreTrainedModel, folder: Path, base: BaseRef) -> None:
    """The adapter's files into `folder` atomically (temporary sibling, then rename)."""
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_adapter_files(model, tmp, base)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def publish(
    model: PreTrainedModel, root: Path, *, version: int, keep: int = 3, base: BaseRef | None = None
) -> PublishedWeights:
    """Write version `version` under `root` and prune all but the `keep` newest versions.

    A model with LoRA attached publishes its adapter, applying to `base` (required then)."""
    root.mkdir(parents=True, exist_ok=True)
    folder = version_folder(root, version)
    if lora_spec_of(model) is not None:
        assert base is not None, "a LoRA model publishes its adapter with the base it applies to"
        write_adapter_folder(model, folder, base)
        weights = folder / ADAPTER_FILE
    else:
        write_model_folder(model, folder)
        weights = folder / WEIGHTS_FILE
    for old in sorted(p for p in root.glob("v*") if p.is_dir() and not p.name.endswith(".tmp"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return PublishedWeights(
        version=version,
        folder=folder,
        source_uri=folder.resolve().as_uri(),
        sha256=file_sha256(weights),
        size_bytes=weights.stat().st_size,
    )
