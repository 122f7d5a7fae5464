"""The policy model run over a packed tree, memory linear in its nodes (torch).

`tree_logprobs` runs the model's own modules (embedding, each decoder layer's norms,
projections, rotary embedding and MLP, final norm, output head) with `tree_attention` in place
of the layer's attention, so nothing of size N x N is built. Each decoder layer runs under
activation checkpointing (only its input is kept; the backward pass recomputes it), and the
output head runs in chunks of nodes, so the N x V logits never exist at once either. Every
node's logprob is the probability of its token given its parent's hidden state: a node shared
by many trajectories is computed once, and the loss gathers it once per trajectory through it.

The layer walk mirrors transformers' Qwen2/Llama decoder layer (pre-norm attention and MLP
with residuals); `check_tree_model` refuses architectures it does not mirror. The tests compare
it with the model's own forward on each trajectory alone.

Legend: N packed nodes, D hidden size, H heads, d head dimension, V vocabulary, K predicted
tokens (sample order, as in `loss`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb, repeat_kv

from services.trainer.packing import AttentionChunk, PackedTree, plan_tree_attention
from services.trainer.tree_attention import tree_attention

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")


@dataclass(frozen=True, slots=True, kw_only=True)
class TreePackingConfig:
    chunk_tokens: int = 256
    """Queries per attention chunk: a long chain is cut into chunks of this many nodes."""
    key_block_tokens: int = 2048
    """Keys per block of the running softmax; a block's scores are H x chunk x block floats."""
    logits_chunk_tokens: int = 1024
    """Nodes per chunk of the output head; a chunk's logits are chunk x V floats."""
    checkpoint_layers: bool = True
    """Keep only each decoder layer's input and recompute the layer in the backward pass."""


class UnsupportedModel(ValueError):
    """The tree walk does not mirror this architecture."""


def check_tree_model(model: PreTrainedModel) -> None:
    model_type = getattr(model.config, "model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModel(
            f"tree packing mirrors the decoder layers of {', '.join(SUPPORTED_MODEL_TYPES)}, "
            f"not model_type {model_type!r}"
        )
    if any(getattr(layer.self_attn, "sliding_window", None) for layer in _layers(model)):
        raise UnsupportedModel("tree packing does not implement sliding-window attention layers")


def _layers(model: PreTrainedModel) -> list[Any]:
    return list(cast(Any, model).model.layers)


def _decoder_layer(
    layer: Any,
    h_1ND: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    chunks: tuple[AttentionChunk, ...],
    config: TreePackingConfig,
) -> torch.Tensor:
    attn = layer.self_attn
    n = h_1ND.shape[1]
    x_1ND = layer.input_layernorm(h_1ND)
    q_1HNd = attn.q_proj(x_1ND).view(1, n, -1, attn.head_dim).transpose(1, 2)
    k_1HNd = attn.k_proj(x_1ND).view(1, n, -1, attn.head_dim).transpose(1, 2)
    v_1HNd = attn.v_proj(x_1ND).view(1, n, -1, attn.head_dim).transpose(1, 2)
    q_1HNd, k_1HNd = apply_rotary_pos_emb(q_1HNd, k_1HNd, cos, sin)
    k_1HNd = repeat_kv(k_1HNd, attn.num_key_value_groups)
    v_1HNd = repeat_kv(v_1HNd, attn.num_key_value_groups)
    o_HNd = tree_attention(
        q_1HNd[0],
        k_1HNd[0],
        v_1HNd[0],
        chunks,
        scale=attn.scaling,
        key_block_tokens=config.key_block_tokens,
    )
    h_1ND = h_1ND + attn.o_proj(o_HNd.transpose(0, 1).reshape(1, n, -1))
    out: torch.Tensor = h_1ND + layer.mlp(layer.post_attention_layernorm(h_1ND))
    return out


def _node_logprobs(head: torch.nn.Module, h_CD: torch.Tensor, token_C: torch.Tensor) -> torch.Tensor:
    logits_CV: torch.Tensor = head(h_CD).float()
    return logits_CV.gather(1, token_C[:, None])[:, 0] - torch.logsumexp(logits_CV, dim=-1)


def tree_logprobs(
    model: PreTrainedModel, tree: PackedTree, config: TreePackingConfig | None = None
) -> torch.Tensor:
    """Logprob of tokens 1..T-1 of every packed sample, in sample order [K] (as `flat_logprobs`)."""
    config = config or TreePackingConfig()
    check_tree_model(model)
    inner = cast(Any, model).model
    chunks = plan_tree_attention(tree.parent, chunk_tokens=config.chunk_tokens)
    device = inner.embed_tokens.weight.device
    ids_1N = torch.tensor(tree.token_ids, dtype=torch.long, device=device)[None]
    pos_1N = torch.tensor(tree.position_ids, dtype=torch.long, device=device)[None]
    h_1ND = inner.embed_tokens(ids_1N)
    cos, sin = inner.rotary_emb(h_1ND, pos_1N)
    for layer in _layers(model):
        if config.checkpoint_layers and torch.is_grad_enabled():
            h_1ND = checkpoint(_decoder_layer, layer, h_1ND, cos, sin, chunks, config, use_reentrant=False)
        else:
            h_1ND = _decoder_layer(layer, h_1ND, cos, sin, chunks, config)
    h_ND = inner.norm(h_1ND)[0]
    # Node c (c with a parent) is predicted from its parent's hidden state.
    children = [c for c, p in enumerate(tree.parent) if p >= 0]
    child_M = torch.tensor(children, dtype=torch.long, device=device)
    parent_M = torch.tensor([tree.parent[c] for c in children], dtype=torch.long, device=device)
    pieces = []
    for a in range(0, len(child_M), config.logits_chunk_tokens):
        sl = slice(a, a + config.logits_chunk_tokens)
        h_CD, token_C = h_ND[parent_M[sl]], ids_1N[0, child_M[sl]]
        if torch.is_grad_enabled():
            pieces.append(checkpoint(_node_logprobs, model.lm_head, h_CD, token_C, use_reentrant=False))
        else:
            pieces.append(_node_logprobs(cast(torch.nn.Module, model.lm_head), h_CD, token_C))
    logprob_N = torch.zeros(tree.num_nodes, dtype=torch.float32, device=device)
    if pieces:
        logprob_N = logprob_N.index_put((child_M,), torch.cat(pieces))
    node_K = torch.tensor([n for path in tree.node_of for n in path[1:]], dtype=torch.long, device=device)
    return logprob_N[node_K]
