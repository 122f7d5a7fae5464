"""LoRA adapters on the policy: configuration, checks, attaching, and the adapter's files (torch, peft).

With LoRA on, PEFT's LoRA layers are injected into the model in place (`inject_adapter_in_model`),
so the model keeps its class and module paths: the loss, tree packing and data parallelism run
the same code, and `flat_parameters` (the trainable parameters) is the adapter alone, which is
what the optimizer holds and what every weight update carries. The base weights are frozen.

The adapter's files are PEFT's own: `adapter_model.safetensors` with PEFT's saved names
(`base_model.model.<module>.lora_A.weight`) and `adapter_config.json`, so `peft` loads them as
they are, and `gyre_base.json` beside them names the base weights they apply to (its folder and
the sha256 of its weights file) for the engines, which merge the adapter into that base.
`peft` is imported only when LoRA is on (the `lora` extra).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from gyre.errors import InvalidArgument

ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
BASE_REF = "gyre_base.json"
PEFT_PREFIX = "base_model.model."
ADAPTER_NAME = "default"
TARGETS_FIELD = "GYRE_TRAINER_LORA_TARGET_MODULES"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoraSpec:
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str | bytes) -> LoraSpec:
        fields = json.loads(text)
        return LoraSpec(**{**fields, "target_modules": tuple(fields["target_modules"])})


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """The last path segment of every linear layer LoRA could adapt."""
    names = {
        path.rsplit(".", 1)[-1]
        for path, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    return sorted(names)


def check_targets(model: torch.nn.Module, spec: LoraSpec) -> None:
    """Refuse a target module the model does not have, naming the setting and what it has."""
    have = linear_module_names(model)
    missing = [t for t in spec.target_modules if t not in have]
    if missing:
        raise InvalidArgument(
            TARGETS_FIELD,
            f"the model has no linear layer named {', '.join(map(repr, missing))}; "
            f"its linear layers are {', '.join(have)}",
        )
    config = getattr(model, "config", None)
    if "lm_head" in spec.target_modules and getattr(config, "tie_word_embeddings", False):
        # Merged into the engines' lm_head, the adapter would change the tied input embedding too.
        raise InvalidArgument(TARGETS_FIELD, "lm_head shares its weight with the input embedding here")


def peft_config(spec: LoraSpec, *, base_model: str = "") -> Any:
    try:
        from peft import LoraConfig
    except ImportError as exc:
        raise InvalidArgument(
            "GYRE_TRAINER_LORA", "LoRA needs the `peft` package: pip install 'gyre[lora]'"
        ) from exc
    return LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,  # type: ignore[arg-type]  # annotated int; PEFT divides it by r
        lora_dropout=spec.dropout,
        target_modules=list(spec.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model or None,
    )


def attach_lora(model: PreTrainedModel, spec: LoraSpec, *, seed: int) -> PreTrainedModel:
    """Inject LoRA layers in place and freeze everything else; B starts at 0, so the model's
    outputs are the base's until the first step. `seed` fixes A's initialisation."""
    from peft import inject_adapter_in_model

    check_targets(model, spec)
    config = peft_config(spec)
    torch.manual_seed(seed)
    inject_adapter_in_model(config, model, adapter_name=ADAPTER_NAME)
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name)
    model.gyre_lora = spec  # type: ignore[assignment]
    return model


def lora_spec_of(model: PreTrainedModel) -> LoraSpec | None:
    spec = getattr(model, "gyre_lora", None)
    return spec if isinstance(spec, LoraSpec) else None


def adapter_tensors(model: PreTrainedModel) -> dict[str, torch.Tensor]:
    """The adapter's weights under PEFT's saved names, on CPU.

    Example: model.layers.0.self_attn.q_proj.lora_A.default.weight
          -> base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
    """
    marker = f".{ADAPTER_NAME}."
    return {
        PEFT_PREFIX + name.replace(marker, "."): param.detach().to("cpu").contiguous()
        for name, param in model.named_parameters()
        if ".lora_" in name
    }


def load_adapter_tensors(model: PreTrainedModel, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy saved adapter weights into an attached adapter; names and shapes checked first."""
    own = {PEFT_PREFIX + n.replace(f".{ADAPTER_NAME}.", "."): p for n, p in model.named_parameters()}
    targets = {n for n in own if ".lora_" in n}
    if set(tensors) != targets:
        odd = sorted(set(tensors) ^ targets)
        raise InvalidArgument("adapter", f"adapter tensors do not match the model's LoRA layers: {odd[:3]}")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(own[name].shape):
            expected = tuple(own[name].shape)
            raise InvalidArgument("adapter", f"{name} has shape {tuple(tensor.shape)}, expected {expected}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            own[name].copy_(tensor)


@dataclass(frozen=True, slots=True, kw_only=True)
class BaseRef:
    """The base weights an adapter applies to."""

    folder: Path
    sha256: str

    def write(self, folder: Path) -> None:
        (folder / BASE_REF).write_text(
            json.dumps({"base_uri": self.folder.resolve().as_uri(), "base_sha256": self.sha256})
        )

    @staticmethod
    def read(folder: Path) -> BaseRef:
        from urllib.parse import urlparse

        fields = json.loads((folder / BASE_REF).read_text())
        return BaseRef(folder=Path(urlparse(fields["base_uri"]).path), sha256=str(fields["base_sha256"]))


def write_adapter_files(model: PreTrainedModel, folder: Path, base: BaseRef) -> int:
    """The adapter's PEFT files and its base reference into `folder` (which exists); its bytes."""
    spec = lora_spec_of(model)
    assert spec is not None, "write_adapter_files needs a model with LoRA attached"
    save_file(adapter_tensors(model), str(folder / ADAPTER_FILE), metadata={"format": "pt"})
    config = peft_config(spec, base_model=str(base.folder.resolve())).to_dict()
    config["target_modules"] = sorted(config["target_modules"])  # a set in PEFT: not JSON
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, default=str) + "\n")
    base.write(folder)
    return (folder / ADAPTER_FILE).stat().st_size


def read_adapter_folder(folder: Path) -> tuple[LoraSpec, dict[str, torch.Tensor], BaseRef]:
    """The spec, tensors and base reference of an adapter folder written by `write_adapter_files`."""
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    spec = LoraSpec(
        rank=int(config["r"]),
        alpha=float(config["lora_alpha"]),
        dropout=float(config.get("lora_dropout") or 0.0),
        target_modules=tuple(sorted(config["target_modules"])),
    )
    return spec, load_file(str(folder / ADAPTER_FILE)), BaseRef.read(folder)


def is_adapter_folder(folder: Path) -> bool:
    return (folder / ADAPTER_CONFIG).is_file() and (folder / ADAPTER_FILE).is_file()
