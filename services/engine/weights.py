"""Load a published weight version into a live model in place (shell: reads files).

The format agreed with the trainer: a folder holding `model.safetensors` with the transformers
state_dict names of the model (what `save_pretrained` writes; tied weights such as `lm_head.weight`
may be left out). Every name and shape is checked before the first copy, so a bad source leaves
the serving weights untouched.

A LoRA run publishes an adapter folder instead (`adapter_model.safetensors`, `adapter_config.json`,
and `gyre_base.json` naming the frozen base's folder and sha256): the engine merges it into that
base (`adapter_merge`), reading the adapted layers' base weights from the base's file each time, so
it holds no second copy of the weights and versions never merge into each other. The base itself
is loaded in full only when the engine does not hold it already (first adapter, another base, or
after a full-weight load or a memory release). `gloo://` / `nccl://` broadcast sources are the trainer's
collective path on clusters and are not handled by this loader.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from gyre.errors import InvalidArgument
from services.engine.adapter_merge import adapter_scale, check_against, lora_pairs, merged_weight

WEIGHTS_FILE = "model.safetensors"
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
BASE_REF = "gyre_base.json"


def source_path(source_uri: str) -> Path:
    """`file:///x/v3` or `/x/v3` -> the path; another scheme is refused."""
    parsed = urlparse(source_uri)
    if parsed.scheme not in ("", "file"):
        raise InvalidArgument(
            "source_uri", f"scheme {parsed.scheme!r} is not supported by this engine; use file:// or a path"
        )
    return Path(parsed.path if parsed.scheme == "file" else source_uri)


def is_adapter_source(source_uri: str) -> bool:
    """Whether a published version is a LoRA adapter (a folder with `adapter_config.json`)."""
    path = source_path(source_uri)
    return path.is_dir() and (path / ADAPTER_CONFIG).is_file()


def weights_path(source_uri: str) -> Path:
    """`file:///x/v3`, `/x/v3` or `/x/v3/model.safetensors` -> the safetensors file."""
    path = source_path(source_uri)
    if path.is_dir():
        path = path / WEIGHTS_FILE
    if not path.is_file():
        raise InvalidArgument("source_uri", f"no weights file at {path}")
    return path


def load_weight_source(model: Any, source_uri: str, *, sha256: str = "") -> None:
    path = weights_path(source_uri)
    if sha256:
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != sha256.lower():
            raise InvalidArgument("sha256", f"weights at {path} hash to {actual}, not {sha256}")
    incoming = load_file(str(path))
    params: dict[str, torch.Tensor] = model.state_dict()
    for name, tensor in incoming.items():
        if name not in params:
            raise InvalidArgument("source_uri", f"tensor {name!r} is not a parameter of this model")
        if tuple(tensor.shape) != tuple(params[name].shape):
            raise InvalidArgument(
                "source_uri",
                f"tensor {name!r} has shape {tuple(tensor.shape)}, model expects {tuple(params[name].shape)}",
            )
    covered = {params[n].data_ptr() for n in incoming}
    missing = [n for n, t in params.items() if n not in incoming and t.data_ptr() not in covered]
    if missing:
        raise InvalidArgument("source_uri", f"weights lack {len(missing)} tensors, e.g. {missing[:3]}")
    with torch.no_grad():
        for name, tensor in incoming.items():
            params[name].copy_(tensor)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterUpdate:
    """A LoRA version ready to copy in: its base, and the merged weight of every adapted layer."""

    base_uri: str
    base_sha256: str
    merged: dict[str, torch.Tensor]
    adapter_bytes: int

    @property
    def mark(self) -> str:
        """Names what a model holds under this update's merged layers: its base and which layers.
        An engine whose mark matches holds every other weight of the base already."""
        return f"{self.base_sha256}:{','.join(sorted(self.merged))}"


def read_adapter_update(
    model_state: dict[str, torch.Tensor] | None, source_uri: str, *, sha256: str = ""
) -> AdapterUpdate:
    """Check an adapter folder against its base (and the model's state dict, when given: vLLM's
    names differ) and merge it into the base's weights.

    Nothing is copied into the model here; every check (the adapter's hash, names and shapes,
    the base's presence) passes first."""
    folder = source_path(source_uri)
    adapter = folder / ADAPTER_FILE
    if not adapter.is_file() or not (folder / BASE_REF).is_file():
        raise InvalidArgument("source_uri", f"{folder} lacks {ADAPTER_FILE} or {BASE_REF}")
    if sha256 and (actual := file_sha256(adapter)) != sha256.lower():
        raise InvalidArgument("sha256", f"adapter at {adapter} hashes to {actual}, not {sha256}")
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    ref = json.loads((folder / BASE_REF).read_text())
    base_file = weights_path(str(ref["base_uri"]))
    scale = adapter_scale(config)
    pairs = lora_pairs(load_file(str(adapter)))
    if model_state is not None:
        check_against(pairs, model_state)
    with safe_open(str(base_file), framework="pt") as base:
        names = set(base.keys())
        wanted = [p.weight_name for p in pairs if p.weight_name in names]
        base_weights = {name: base.get_tensor(name) for name in wanted}
    check_against(pairs, base_weights)
    merged = {p.weight_name: merged_weight(base_weights[p.weight_name], p, scale) for p in pairs}
    return AdapterUpdate(
        base_uri=str(ref["base_uri"]),
        base_sha256=str(ref["base_sha256"]),
        merged=merged,
        adapter_bytes=adapter.stat().st_size,
    )


def apply_adapter_source(model: Any, source_uri: str, *, sha256: str = "", loaded_base: str = "") -> str:
    """Serve a LoRA version: the base with the adapter merged in. The base is loaded in full
    unless `loaded_base` says the model holds it with the same layers adapted (what the previous
    call returned): every other weight is then the base's already. Returns that mark."""
    params: dict[str, torch.Tensor] = model.state_dict()
    update = read_adapter_update(params, source_uri, sha256=sha256)
    for name in update.merged:
        shared = [n for n, t in params.items() if n != name and t.data_ptr() == params[name].data_ptr()]
        if shared:  # a tied weight: merging into it would change the other layer too
            raise InvalidArgument("source_uri", f"the adapter changes {name}, tied here to {shared[0]}")
    mark = update.mark
    if loaded_base != mark:
        load_weight_source(model, update.base_uri, sha256=update.base_sha256)
    with torch.no_grad():
        for name, tensor in update.merged.items():
            params[name].copy_(tensor)
    return mark
