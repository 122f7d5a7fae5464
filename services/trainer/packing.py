"""Tree packing: one execution's trajectories as a token trie, computed once per shared prefix (pure).

Trajectories of one execution share prefixes (a retry forks a chain, a sub-agent starts from the
main agent's context). Packed, every distinct (prefix, token) becomes one node; a node attends
to its ancestors and itself only, and its position id is its depth, so each branch sees exactly
the sequence it would see alone while the shared prefix is computed once.

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


def tree_attention_mask(tree: PackedTree) -> torch.Tensor:
    """Boolean [N, N] mask: row i is true on i's ancestors and on i itself.

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


def target_index(tree: PackedTree) -> tuple[torch.Tensor, torch.Tensor]:
    """For every (sample, t >= 1) in sample order: the node whose logits predict token t, and token t.

    Flattening the result per sample gives the same order as `flat_target_index`, so losses
    computed either way line up token for token.
    """
    from_node: list[int] = []
    target: list[int] = []
    for path in tree.node_of:
        from_node.extend(path[:-1])
        target.extend(tree.token_ids[n] for n in path[1:])
    return torch.tensor(from_node, dtype=torch.long), torch.tensor(target, dtype=torch.long)
