"""Memory-linear tree packing: the chunk plan, chunked attention, exactness against trajectories alone."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from trainer_builders import on_policy, tiny_model

from services.trainer.loss import LossConfig, policy_loss, token_targets
from services.trainer.microbatch import flat_parameters
from services.trainer.packing import pack_sequences, plan_tree_attention, tree_attention_mask
from services.trainer.policy import packed_logprobs, separate_logprobs
from services.trainer.samples import Sample
from services.trainer.synthetic import synthetic_agent_tree
from services.trainer.tree_attention import tree_attention
from services.trainer.tree_forward import TreePackingConfig

FORKED = [[1, 2, 3, 100, 101, 102], [1, 2, 3, 4, 103, 104], [1, 2, 50, 105], [1, 2, 3, 100, 101, 106, 107]]
SMALL_CHUNKS = TreePackingConfig(chunk_tokens=64, key_block_tokens=96, logits_chunk_tokens=100)


def visible_sets(parent: tuple[int, ...], chunk_tokens: int) -> list[set[int]]:
    out: list[set[int]] = [set() for _ in parent]
    for chunk in plan_tree_attention(parent, chunk_tokens=chunk_tokens):
        seen = {k for a, b in chunk.visible for k in range(a, b)}
        for q in range(chunk.start, chunk.stop):
            out[q] = seen | set(range(chunk.start, q + 1))
    return out


@pytest.mark.parametrize("chunk_tokens", [1, 2, 3, 100])
def test_the_chunk_plan_lets_each_node_see_exactly_its_ancestors(chunk_tokens: int) -> None:
    tree = pack_sequences(FORKED)
    mask = tree_attention_mask(tree)
    expected = [set(torch.nonzero(row)[:, 0].tolist()) for row in mask]
    assert visible_sets(tree.parent, chunk_tokens) == expected


def test_a_long_chain_is_cut_into_chunks_that_see_all_before_them() -> None:
    chunks = plan_tree_attention(tuple(range(-1, 299)), chunk_tokens=64)
    assert [(c.start, c.stop) for c in chunks] == [(0, 64), (64, 128), (128, 192), (192, 256), (256, 300)]
    assert chunks[-1].visible == ((0, 256),)


def test_the_plan_refuses_a_parent_after_its_child() -> None:
    with pytest.raises(ValueError, match="node 1 has parent 2"):
        plan_tree_attention((-1, 2, 0), chunk_tokens=4)


def test_chunked_attention_and_its_gradients_equal_the_masked_dense_attention() -> None:
    torch.manual_seed(0)
    tree = pack_sequences(FORKED)
    chunks = plan_tree_attention(tree.parent, chunk_tokens=2)
    q, k, v = (torch.randn(2, tree.num_nodes, 4, dtype=torch.float64, requires_grad=True) for _ in range(3))
    out = tree_attention(q, k, v, chunks, scale=0.5, key_block_tokens=3)
    dense = torch.nn.functional.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=tree_attention_mask(tree), scale=0.5
    )[0]
    weight = torch.randn_like(out)
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
    dense_grads = torch.autograd.grad((dense * weight).sum(), (q, k, v))
    assert torch.allclose(out, dense, atol=1e-12)
    for g, d in zip(grads, dense_grads, strict=True):
        assert torch.allclose(g, d, atol=1e-12)


def agent_tree(model: Any) -> list[Sample]:
    """Compactions, sub-agents and retries in about 1500 unique tokens (seed 0 has all three)."""
    samples = synthetic_agent_tree(seed=0, num_tokens=1500, context_tokens=512, vocab_size=256)
    kinds = {s.trajectory_id.split("/")[1].split("-")[0] for s in samples}
    assert kinds == {"main", "summary", "sub", "retry"}
    return on_policy(samples, model)


LogprobsFn = Callable[[Any, Sequence[Sequence[int]]], torch.Tensor]


def loss_and_gradient(model: Any, samples: list[Sample], logprobs: LogprobsFn) -> tuple[float, torch.Tensor]:
    for p in model.parameters():
        p.grad = None
    loss, _ = policy_loss(
        logprobs(model, [s.token_ids for s in samples]), token_targets(samples), LossConfig(kl_coef=0.1)
    )
    loss.backward()  # type: ignore[no-untyped-call]
    grad = torch.cat([p.grad.reshape(-1).double() for p in flat_parameters(model)])  # type: ignore[union-attr]
    return float(loss.detach()), grad


def test_packed_agent_tree_loss_and_gradients_equal_each_trajectory_run_alone() -> None:
    model = tiny_model()
    samples = agent_tree(model)
    tree = pack_sequences([s.token_ids for s in samples])
    assert tree.num_flat_tokens > 1.5 * tree.num_nodes  # prefixes really are shared
    alone_loss, alone_grad = loss_and_gradient(model, samples, separate_logprobs)
    packed_loss, packed_grad = loss_and_gradient(
        model, samples, lambda m, seqs: packed_logprobs(m, seqs, SMALL_CHUNKS)
    )
    assert packed_loss == pytest.approx(alone_loss, rel=1e-5)
    assert float((packed_grad - alone_grad).abs().max() / alone_grad.abs().max()) <= 1e-5


def test_layer_checkpointing_changes_no_gradient() -> None:
    model = tiny_model()
    samples = agent_tree(model)[:3]
    plain = TreePackingConfig(chunk_tokens=64, key_block_tokens=96, checkpoint_layers=False)
    _, with_ckpt = loss_and_gradient(model, samples, lambda m, seqs: packed_logprobs(m, seqs, SMALL_CHUNKS))
    _, without = loss_and_gradient(model, samples, lambda m, seqs: packed_logprobs(m, seqs, plain))
    assert float((with_ckpt - without).abs().max() / without.abs().max()) <= 1e-6
