"""Attention over a packed execution tree in chunks, memory linear in the nodes (pure, torch).

Each chunk of queries (see `packing.plan_tree_attention`) attends to the node ranges of its
ancestors and causally to itself, key block by key block with a running softmax; no N x N mask
or score matrix ever exists. Autograd would keep every block's scores for the backward pass
(quadratic again), so this is a `torch.autograd.Function` that saves only its inputs, its output
and the log-sum-exp per query, and recomputes each block's probabilities in `backward`: the
flash-attention recipe, written with plain torch operations so it runs on any device torch has.

Gradients flow into the shared prefix: a key/value of a prefix node collects the gradient of
every branch that attends to it, exactly what running each branch on its own and summing gives.

Legend: H heads, N packed nodes, d head dimension, C queries of a chunk, L keys of a block.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from services.trainer.packing import AttentionChunk


def _key_blocks(chunk: AttentionChunk, key_block_tokens: int) -> Iterator[tuple[int, int, bool]]:
    """(start, stop, causal) of the key blocks a chunk attends to: full ranges, then itself."""
    for a, b in chunk.visible:
        for s in range(a, b, key_block_tokens):
            yield s, min(s + key_block_tokens, b), False
    yield chunk.start, chunk.stop, True


def _scores(q_HCd: torch.Tensor, k_HLd: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    s_HCL = torch.matmul(q_HCd, k_HLd.transpose(1, 2)) * scale
    if causal:  # the chunk's own block: query i sees keys 0..i (C == L here)
        n = s_HCL.shape[-1]
        above = torch.ones(n, n, dtype=torch.bool, device=s_HCL.device).triu(1)
        s_HCL = s_HCL.masked_fill(above, float("-inf"))
    return s_HCL


def _accumulation_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for half-precision inputs (bf16 under autocast), the input's own dtype from float32 up."""
    return torch.promote_types(x.dtype, torch.float32)


class _TreeAttention(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        q_HNd: torch.Tensor,
        k_HNd: torch.Tensor,
        v_HNd: torch.Tensor,
        chunks: Sequence[AttentionChunk],
        scale: float,
        key_block_tokens: int,
    ) -> torch.Tensor:
        acc = _accumulation_dtype(q_HNd)
        out_HNd = torch.empty_like(q_HNd)
        lse_HN = torch.empty(q_HNd.shape[:2], dtype=acc, device=q_HNd.device)
        for chunk in chunks:
            q_HCd = q_HNd[:, chunk.start : chunk.stop]
            m_HC = torch.full(q_HCd.shape[:2], float("-inf"), dtype=acc, device=q_HNd.device)
            l_HC = torch.zeros_like(m_HC)
            acc_HCd = torch.zeros(q_HCd.shape, dtype=acc, device=q_HNd.device)
            for a, b, causal in _key_blocks(chunk, key_block_tokens):
                s_HCL = _scores(q_HCd, k_HNd[:, a:b], scale, causal).to(acc)
                m_new = torch.maximum(m_HC, s_HCL.amax(dim=-1))
                p_HCL = torch.exp(s_HCL - m_new[..., None])
                correction = torch.exp(m_HC - m_new)
                l_HC = l_HC * correction + p_HCL.sum(dim=-1)
                acc_HCd = acc_HCd * correction[..., None] + torch.matmul(p_HCL.to(v_HNd.dtype), v_HNd[:, a:b])
                m_HC = m_new
            out_HNd[:, chunk.start : chunk.stop] = (acc_HCd / l_HC[..., None]).to(out_HNd.dtype)
            lse_HN[:, chunk.start : chunk.stop] = m_HC + torch.log(l_HC)
        ctx.save_for_backward(q_HNd, k_HNd, v_HNd, out_HNd, lse_HN)
        ctx.chunks = chunks
        ctx.scale = scale
        ctx.key_block_tokens = key_block_tokens
        return out_HNd

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (dout_HNd,) = grads
        q_HNd, k_HNd, v_HNd, out_HNd, lse_HN = ctx.saved_tensors
        scale: float = ctx.scale
        acc = _accumulation_dtype(q_HNd)
        dq_HNd = torch.zeros_like(q_HNd, dtype=acc)
        dk_HNd = torch.zeros_like(k_HNd, dtype=acc)
        dv_HNd = torch.zeros_like(v_HNd, dtype=acc)
        delta_HN = (dout_HNd.to(acc) * out_HNd.to(acc)).sum(dim=-1)
        for chunk in ctx.chunks:
            sl = slice(chunk.start, chunk.stop)
            q_HCd, do_HCd = q_HNd[:, sl].to(acc), dout_HNd[:, sl].to(acc)
            lse_HC, delta_HC = lse_HN[:, sl], delta_HN[:, sl]
            dq_HCd = torch.zeros(q_HCd.shape, dtype=acc, device=q_HNd.device)
            for a, b, causal in _key_blocks(chunk, ctx.key_block_tokens):
                k_HLd, v_HLd = k_HNd[:, a:b].to(acc), v_HNd[:, a:b].to(acc)
                p_HCL = torch.exp(_scores(q_HCd, k_HLd, scale, causal) - lse_HC[..., None])
                dv_HNd[:, a:b] += torch.matmul(p_HCL.transpose(1, 2), do_HCd)
                dp_HCL = torch.matmul(do_HCd, v_HLd.transpose(1, 2))
                ds_HCL = p_HCL * (dp_HCL - delta_HC[..., None]) * scale
                dq_HCd += torch.matmul(ds_HCL, k_HLd)
                dk_HNd[:, a:b] += torch.matmul(ds_HCL.transpose(1, 2), q_HCd)
            dq_HNd[:, sl] = dq_HCd
        return (
            dq_HNd.to(q_HNd.dtype),
            dk_HNd.to(k_HNd.dtype),
            dv_HNd.to(v_HNd.dtype),
            None,
            None,
            None,
        )


def tree_attention(
    q_HNd: torch.Tensor,
    k_HNd: torch.Tensor,
    v_HNd: torch.Tensor,
    chunks: Sequence[AttentionChunk],
    *,
    scale: float,
    key_block_tokens: int = 2048,
) -> torch.Tensor:
    """softmax(q k^T * scale) v with each query seeing its tree ancestors and itself; [H, N, d].

    Keys and values must already have one head per query head (grouped heads repeated).
    """
    out: torch.Tensor = _TreeAttention.apply(  # type: ignore[no-untyped-call]
        q_HNd, k_HNd, v_HNd, chunks, scale, key_block_tokens
    )
    return out
