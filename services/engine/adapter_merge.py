"""Merging a LoRA adapter into base weights: names, checks and the sum W0 + (alpha/r) B A (pure, torch).

A LoRA weight update is a PEFT adapter (`adapter_model.safetensors` + `adapter_config.json`): for
each adapted linear layer, `lora_A` (r x in) and `lora_B` (out x r) under PEFT's saved names,
`base_model.model.<module>.lora_A.weight`. Serving it means replacing each adapted layer's weight
by `W0 + scale * (B @ A)` with `scale = lora_alpha / r`, which is the layer PEFT computes
(dropout aside, which is off at inference). The sum is taken from the *base* weights each time,
never from the weights of the previous version, so versions do not accumulate rounding.

Legend: O out features, I in features, R rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from gyre.errors import InvalidArgument

PEFT_PREFIX = "base_model.model."
A_SUFFIX = ".lora_A.weight"
B_SUFFIX = ".lora_B.weight"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoraPair:
    module: str
    """The adapted layer's module path in the base model, e.g. `model.layers.0.self_attn.q_proj`."""
    a_RI: torch.Tensor
    b_OR: torch.Tensor

    @property
    def weight_name(self) -> str:
        return f"{self.module}.weight"


def adapter_scale(config: Mapping[str, object]) -> float:
    """`lora_alpha / r` from a PEFT adapter config; the variants PEFT scales otherwise are refused.

    Example: {"r": 8, "lora_alpha": 16} -> 2.0
    """
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or rank <= 0:
        raise InvalidArgument("adapter_config.r", f"a rank above 0, got {rank!r}")
    if not isinstance(alpha, (int, float)) or alpha <= 0:
        raise InvalidArgument("adapter_config.lora_alpha", f"a number above 0, got {alpha!r}")
    for key in ("use_rslora", "use_dora"):
        if config.get(key):
            raise InvalidArgument(f"adapter_config.{key}", "is not supported by this engine's merge")
    for key in ("rank_pattern", "alpha_pattern"):
        if config.get(key):
            raise InvalidArgument(f"adapter_config.{key}", "per-layer ranks or alphas are not supported")
    return float(alpha) / rank


def lora_pairs(tensors: Mapping[str, torch.Tensor]) -> list[LoraPair]:
    """Pair every `lora_A` with its `lora_B` by module; a stray tensor or half a pair is refused.

    Example:
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": A,
         "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": B}
        -> [LoraPair(module="model.layers.0.self_attn.q_proj", a_RI=A, b_OR=B)]
    """
    a_of: dict[str, torch.Tensor] = {}
    b_of: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if not name.startswith(PEFT_PREFIX) or not name.endswith((A_SUFFIX, B_SUFFIX)):
            raise InvalidArgument("adapter", f"tensor {name!r} is not a PEFT LoRA A or B weight")
        inner = name.removeprefix(PEFT_PREFIX)
        if inner.endswith(A_SUFFIX):
            a_of[inner.removesuffix(A_SUFFIX)] = tensor
        else:
            b_of[inner.removesuffix(B_SUFFIX)] = tensor
    if a_of.keys() != b_of.keys():
        odd = sorted(a_of.keys() ^ b_of.keys())
        raise InvalidArgument("adapter", f"modules with only one of lora_A/lora_B: {odd[:3]}")
    pairs = []
    for module in sorted(a_of):
        a_RI, b_OR = a_of[module], b_of[module]
        if a_RI.dim() != 2 or b_OR.dim() != 2 or a_RI.shape[0] != b_OR.shape[1]:
            raise InvalidArgument(
                "adapter",
                f"{module}: lora_A {tuple(a_RI.shape)} and lora_B {tuple(b_OR.shape)} do not compose",
            )
        pairs.append(LoraPair(module=module, a_RI=a_RI, b_OR=b_OR))
    if not pairs:
        raise InvalidArgument("adapter", "holds no LoRA weights")
    return pairs


def check_against(pairs: list[LoraPair], weights: Mapping[str, torch.Tensor]) -> None:
    """Every adapted layer exists in the model with the shape B A has: checked before any copy."""
    for pair in pairs:
        weight = weights.get(pair.weight_name)
        if weight is None:
            raise InvalidArgument("adapter", f"module {pair.module!r} is not a layer of this model")
        expected = (pair.b_OR.shape[0], pair.a_RI.shape[1])
        if tuple(weight.shape) != expected:
            raise InvalidArgument(
                "adapter",
                f"{pair.module}: B A is {expected}, the model's weight is {tuple(weight.shape)}",
            )


def merged_weight(base_OI: torch.Tensor, pair: LoraPair, scale: float) -> torch.Tensor:
    """`W0 + scale * (B @ A)`, computed in float32 (or wider) and returned in the base's dtype."""
    compute = torch.promote_types(base_OI.dtype, torch.float32)
    delta_OI = (pair.b_OR.to(compute) @ pair.a_RI.to(compute)) * scale
    return (base_OI.to(compute) + delta_OI.to(base_OI.device)).to(base_OI.dtype)


def merged_state(
    base: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor], config: Mapping[str, object]
) -> dict[str, torch.Tensor]:
    """The merged weights of every adapted layer, by the base model's state-dict names."""
    scale = adapter_scale(config)
    pairs = lora_pairs(tensors)
    check_against(pairs, base)
    return {p.weight_name: merged_weight(base[p.weight_name], p, scale) for p in pairs}
