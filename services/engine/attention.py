"""Prefill attention for the torch engine: a prompt chunk over a long cached prefix, on CPU kernels.

A chunk of T new tokens after P cached ones needs bottom-right causal attention over P + T keys.
transformers' SDPA path builds an explicit [T, P + T] mask for it (torch's `is_causal` is
top-left aligned), which the kernel then reads for every block, and, with a mask, copies the one
KV head once per query head (`repeat_kv`: the whole cache, every layer, every chunk). Here the
chunk is split instead:

    prefix part: every new token sees all P cached keys      -> no mask at all
    block part:  the T new tokens among themselves, causal    -> `is_causal` (square, so exact)

Both run in the flash kernel, which also returns each row's log-sum-exp; the two partial results
merge exactly (`merge_partial`). The prefix part folds the query heads that share a KV head into
the query rows, so the cached keys are read once and never copied.

Registered as the attention implementation `gyre_prefill`: its mask function builds no mask (the
engine prefills one unpadded row at a time, and its decode step passes its own 4-D mask), and every
call that is not such a prefill chunk goes to transformers' SDPA path unchanged.

Legend: B batch, Hq query heads, Hk KV heads, G = Hq / Hk, T new tokens, P cached tokens, D head size.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface

NAME = "gyre_prefill"


def merge_partial(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """Attention over keys A ∪ B from attention over A and over B with their log-sum-exps.

    Shapes: out [..., T, D], lse [..., T]. Each output is a softmax-weighted mean; weighting
    each by its share of the total exp-mass gives the softmax over the union.
    """
    top = torch.maximum(lse_a, lse_b)
    w_a = torch.exp(lse_a - top).unsqueeze(-1)
    w_b = torch.exp(lse_b - top).unsqueeze(-1)
    return (out_a * w_a + out_b * w_b) / (w_a + w_b)


def _flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)[
        :2
    ]
    return out, lse


def chunk_attention(
    query_BHqTD: torch.Tensor,
    key_BHkLD: torch.Tensor,
    value_BHkLD: torch.Tensor,
    *,
    scale: float | None,
) -> torch.Tensor:
    """Bottom-right causal attention of T queries over L = P + T keys; returns [B, Hq, T, D]."""
    b, hq, t, d = query_BHqTD.shape
    hk, length = key_BHkLD.shape[1], key_BHkLD.shape[2]
    groups, past = hq // hk, length - t
    key_new, value_new = key_BHkLD[:, :, past:], value_BHkLD[:, :, past:]
    if groups > 1:
        key_new = key_new.repeat_interleave(groups, dim=1)  # T keys only: a small copy
        value_new = value_new.repeat_interleave(groups, dim=1)
    out_block, lse_block = _flash(query_BHqTD, key_new, value_new, causal=True, scale=scale)
    if past == 0:
        return out_block
    # Queries of one KV head's G query heads become G*T rows against that head's P cached keys.
    query_BHkGTD = query_BHqTD.reshape(b, hk, groups * t, d)
    out_prefix, lse_prefix = _flash(
        query_BHkGTD, key_BHkLD[:, :, :past], value_BHkLD[:, :, :past], causal=False, scale=scale
    )
    return merge_partial(out_prefix.reshape(b, hq, t, d), lse_prefix.reshape(b, hq, t), out_block, lse_block)


def gyre_prefill_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; output [B, T, Hq, D]."""
    prefill = (
        attention_mask is None
        and query.shape[2] > 1
        and query.device.type == "cpu"
        and dropout == 0.0
        and kwargs.get("position_bias") is None
        and key.shape[2] >= query.shape[2]
    )
    if not prefill:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    out = chunk_attention(query, key, value, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def no_mask(*_args: Any, **_kwargs: Any) -> None:
    """The engine's calls need no model-built mask (see the module docstring)."""
    return None


AttentionInterface.register(NAME, gyre_prefill_attention)
AttentionMaskInterface.register(NAME, no_mask)
