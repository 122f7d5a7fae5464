"""Tree packing: one execution's trajectories as a token trie, computed once per shared prefix (pure).

Trajectories of one execution share prefixes (a retry forks a chain, a sub-agent starts from the
main agent's context). Packed, every distinct (prefix, token) becomes one node; a node attends
to its ancestors and itself only, and its position id is its depth, so each branch sees exactly
the sequence it would see alone while the shared prefix is computed once.

`plan_tree_attention` describes that ancestor relation without an N x N mask: nodes created one
after another along a chain form a *run*; a run's queries see, in full, the ranges of nodes its
first node descends from, and their own run causally. Runs are cut into chunks of at most
`chunk_tokens` queries, so a long chain is never one block. The plan's size grows with the
number of forks, not with the square of the tokens. `tree_attention_mask` (dense) stays as the
reference the tests compare the plan with.

Legend: N packed nodes, S samples, T tokens of one sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True, kw_only=True)
class PackedTree:
    """A forest of token nodes in creation order (a parent always precedes its children)."""

    token_ids: tuple[int, ...]
    parent: tuple[int, ...]
    """Index of each node's parent; -1 for a root."""
    position_ids: tuple[int, ...]
    """Depth of each node, the position the token has in every sequence through it."""
    node_of: tuple[tuple[int, ...], ...]
    """node_of[s][t]: the node holding token t of sample s."""

    @property
    def num_nodes(self) -> int:
        return len(self.token_ids)

    @property
    def num_flat_tokens(self) -> int:
        return sum(len(n) for n in self.node_of)


def pack_sequences(sequences: Sequence[Sequence[int]]) -> PackedTree:
    """Merge token sequences into a trie; equal prefixes share nodes.

    Example:
        [[1, 2, 3, 100], [1, 2, 3, 101, 102], [1, 2, 7]]
        -> tokens (1, 2, 3, 100, 101, 102, 7), parent (-1, 0, 1, 2, 2, 4, 1),
           position_ids (0, 1, 2, 3, 3, 4, 2), 7 nodes for 12 flat tokens
    """
    token_ids: list[int] = []
    parent: list[int] = []
    depth: list[int] = []
    children: dict[tuple[int, int], int] = {}
    node_of: list[tuple[int, ...]] = []
    for seq in sequences:
        path: list[int] = []
        at = -1
        for token in seq:
            key = (at, token)
            node = children.get(key)
            if node is None:
                node = len(token_ids)
                children[key] = node
                token_ids.append(token)
                parent.append(at)
                depth.append(depth[at] + 1 if at >= 0 else 0)
            path.append(node)
            at = node
        node_of.append(tuple(path))
    return PackedTree(
        token_ids=tuple(token_ids), parent=tuple(parent), position_ids=tuple(depth), node_of=tuple(node_of)
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionChunk:
    """Queries [start, stop): consecutive nodes of one chain, each the parent of the next."""

    start: int
    stop: int
    visible: tuple[tuple[int, int], ...]
    """Node ranges [a, b) every query of the chunk sees in full: its ancestors before `start`.

    The chunk's own nodes [start, stop) are seen causally (query start+i sees start..start+i).
    """


def plan_tree_attention(parent: Sequence[int], *, chunk_tokens: int) -> tuple[AttentionChunk, ...]:
    """Chunks of queries and the node ranges they attend to, the tree's attention without a mask.

    Example:
        parent (-1, 0, 1, 2, 2, 4, 1) (runs [0,4), [4,6) below node 2, [6,7) below node 1),
        chunk_tokens=2 -> (0,2: -), (2,4: [0,2)), (4,6: [0,3)), (6,7: [0,2))
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    run_of: list[int] = []
    run_start: list[int] = []
    ancestors: list[tuple[tuple[int, int], ...]] = []
    """Per run: the node ranges above its first node."""
    for i, p in enumerate(parent):
        if p >= i:
            raise ValueError(f"node {i} has parent {p}: a parent must come before its children")
        if i == 0 or p != i - 1:
            if p < 0:
                above: tuple[tuple[int, int], ...] = ()
            else:
                r = run_of[p]
                above = (*ancestors[r], (run_start[r], p + 1))
            run_start.append(i)
            ancestors.append(above)
        run_of.append(len(run_start) - 1)
    chunks: list[AttentionChunk] = []
    run_stop = [*run_start[1:], len(parent)]
    for r, (start, stop) in enumerate(zip(run_start, run_stop, strict=True)):
        for a in range(start, stop, chunk_tokens):
            own = ((start, a),) if a > start else ()
            chunks.append(
                AttentionChunk(start=a, stop=min(a + chunk_tokens, stop), visible=(*ancestors[r], *own))
            )
    return tuple(chunks)


def tree_attention_mask(tree: PackedTree) -> torch.Tensor:
    """Boolean [N, N] mask: row i is true on i's ancestors and on i itself (quadratic: tests only).

    Example:
        parent (-1, 0, 0) -> [[T, F, F], [T, T, F], [T, F, T]]
    """
    n = tree.num_nodes
    mask_NN = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(tree.parent):
        if p >= 0:
            mask_NN[i] = mask_NN[p]  # parents come first, so row p is complete
        mask_NN[i, i] = True
    return mask_NN
