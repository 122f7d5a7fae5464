"""Load a published weight version into a live model in place (shell: reads files).

The format agreed with the trainer: a folder holding `model.safetensors` with the transformers
state_dict names of the model (what `save_pretrained` writes; tied weights such as `lm_head.weight`
may be left out). Every name and shape is checked before the first copy, so a bad source leaves
the serving weights untouched. `gloo://` / `nccl://` broadcast sources are the trainer's
collective path on clusters and are not handled by this loader.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from safetensors.torch import load_file

from gyre.errors import InvalidArgument

WEIGHTS_FILE = "model.safetensors"


def weights_path(source_uri: str) -> Path:
    """`file:///x/v3`, `/x/v3` or `/x/v3/model.safetensors` -> the safetensors file."""
    parsed = urlparse(source_uri)
    if parsed.scheme not in ("", "file"):
        raise InvalidArgument(
            "source_uri", f"scheme {parsed.scheme!r} is not supported by this engine; use file:// or a path"
        )
    path = Path(parsed.path if parsed.scheme == "file" else source_uri)
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
