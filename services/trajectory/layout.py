"""The shape of an execution tree without its tokens, rebuilt from the stored projection (pure).

Replay does not need a tree that can match new prompts; it needs the selected trajectories'
paths as buffer ranges and the tokens on those ranges. Ingest therefore stores, per call, where
its new prompt and new output hang in the tree (`CallShape`, the `tree_calls` projection). The
buffer is the calls' new tokens in seq order (each call appends its new prompt, then its new
output), so segment offsets are a cumulative sum and no prompt is matched again: loading the
shape of a 1M-token execution is a few numpy operations over its ~500 calls. Only the calls
that own a segment on a selected path then need their token blob read and decompressed.

Example (the tree of tree.py's docstring):
    c0: new prompt 3, new output 2, prompt_attach=ROOT, output_attach=2
    c1: new prompt 1, new output 1, prompt_attach=4, output_attach=5
    -> segments start [0, 3, 5, 6], parent [ROOT, 2, 4, 5], owner [0, 0, 1, 1]
    -> path_spans(shape, 6) == [(0, 3), (3, 5), (5, 6), (6, 7)]
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from services.trajectory.records import Float32Array, Int32Array, Int64Array
from services.trajectory.tree import ROOT, ExecutionTree, select_chains

Span = tuple[int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallShapes:
    """The `tree_calls` projection of one execution: one entry per call, in seq order."""

    num_new_prompt: Int64Array
    num_new_output: Int64Array
    prompt_attach: Int64Array
    """Position each call's new prompt tokens hang below (ROOT at the top; its prompt's end if none)."""
    output_attach: Int64Array
    """Position each call's new output tokens hang below (the call's end if none are new)."""
    chain: Int64Array

    def __len__(self) -> int:
        return len(self.chain)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainHead:
    """A trajectory as the `trajectories` projection stores it (enough to select and replay it)."""

    index: int
    agent_role: str
    agent_id: str
    first_seq: int
    last_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeShape:
    """Segments of the flat buffer (sorted by start) and every call's place in it."""

    seg_start: list[int]
    seg_parent: list[int]
    seg_owner: list[int]
    call_start: list[int]
    """Buffer position of each call's first new token (new prompt first, then new output)."""
    call_end: list[int]
    """Position of each call's last token (prompt + output), as `PlacedCall.end`."""
    num_new_prompt: list[int]
    num_new_output: list[int]
    n: int


def call_shapes(tree: ExecutionTree) -> CallShapes:
    """The projection of a tree that was built by ingest or folded from the log."""
    calls = tree.calls
    # New output tokens form one segment that ends at the call's end.
    new_output = [
        c.end - tree.seg_start[tree.seg_of(c.end)] + 1 if c.end != c.output_attach else 0 for c in calls
    ]
    return CallShapes(
        num_new_prompt=np.array([c.prompt_len - c.num_shared_prompt for c in calls], np.int64),
        num_new_output=np.array(new_output, np.int64),
        prompt_attach=np.array([c.prompt_attach for c in calls], np.int64),
        output_attach=np.array([c.output_attach for c in calls], np.int64),
        chain=np.array([c.chain for c in calls], np.int64),
    )


def tree_shape(calls: CallShapes) -> TreeShape:
    """Lay the calls' segments out in the buffer, with no token and no matching."""
    new_prompt, new_output = calls.num_new_prompt, calls.num_new_output
    sizes = new_prompt + new_output
    call_start = np.cumsum(sizes) - sizes
    seqs = np.arange(len(calls), dtype=np.int64)
    has_prompt, has_output = new_prompt > 0, new_output > 0
    # A call's prompt segment precedes its output segment, and calls come in buffer order, so
    # sorting by start orders the segments; starts are distinct as segments are never empty.
    starts = np.concatenate([call_start[has_prompt], (call_start + new_prompt)[has_output]])
    parents = np.concatenate([calls.prompt_attach[has_prompt], calls.output_attach[has_output]])
    owners = np.concatenate([seqs[has_prompt], seqs[has_output]])
    order = np.argsort(starts, kind="stable")
    call_end = np.where(has_output, call_start + sizes - 1, calls.output_attach)
    return TreeShape(
        seg_start=starts[order].tolist(),
        seg_parent=parents[order].tolist(),
        seg_owner=owners[order].tolist(),
        call_start=call_start.tolist(),
        call_end=call_end.tolist(),
        num_new_prompt=new_prompt.tolist(),
        num_new_output=new_output.tolist(),
        n=int(sizes.sum()),
    )


def path_spans(shape: TreeShape, pos: int) -> list[Span]:
    """Buffer ranges [start, stop) from the root down to `pos`, as `ExecutionTree.path_spans`."""
    spans: list[Span] = []
    stop = pos + 1
    while pos != ROOT:
        seg = bisect.bisect_right(shape.seg_start, pos) - 1
        spans.append((shape.seg_start[seg], stop))
        pos = shape.seg_parent[seg]
        stop = pos + 1
    spans.reverse()
    return spans


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenBuffers:
    """The tree's flat buffer, filled only where calls were loaded (zeros elsewhere).

    Context positions hold logprob 0 and version 0, as in `ExecutionTree`.
    """

    tokens: Int32Array
    target: np.ndarray  # bool
    logprob: Float32Array
    version: Int64Array


def empty_buffers(n: int) -> TokenBuffers:
    return TokenBuffers(
        tokens=np.zeros(n, np.int32),
        target=np.zeros(n, np.bool_),
        logprob=np.zeros(n, np.float32),
        version=np.zeros(n, np.int64),
    )


def fill_call(
    buffers: TokenBuffers,
    shape: TreeShape,
    seq: int,
    *,
    new_prompt_ids: Int32Array,
    new_output_ids: Int32Array,
    new_output_logprobs: Float32Array,
    new_output_versions: Int64Array,
) -> None:
    """Write one call's new tokens where `tree_shape` put them (as `fold_stored` appends them)."""
    if len(new_prompt_ids) != shape.num_new_prompt[seq] or len(new_output_ids) != shape.num_new_output[seq]:
        raise ValueError(f"call {seq}: its stored blob disagrees with its tree_calls row")
    start = shape.call_start[seq]
    mid = start + len(new_prompt_ids)
    stop = mid + len(new_output_ids)
    buffers.tokens[start:mid] = new_prompt_ids
    buffers.tokens[mid:stop] = new_output_ids
    buffers.target[mid:stop] = True
    buffers.logprob[mid:stop] = new_output_logprobs
    buffers.version[mid:stop] = new_output_versions


@dataclass(frozen=True, slots=True, kw_only=True)
class SelectedPath:
    """A selected trajectory: its chain and its token path as buffer ranges, root first."""

    chain_index: int
    agent_role: str
    spans: Sequence[Span]


def select_paths(
    shape: TreeShape, heads: Sequence[ChainHead], *, j_max: int, role_rank: Sequence[str]
) -> list[SelectedPath]:
    """J_max selection over the stored chains, each as the path to its last call's end."""
    return [
        SelectedPath(
            chain_index=c.index, agent_role=c.agent_role, spans=path_spans(shape, shape.call_end[c.last_seq])
        )
        for c in select_chains(heads, j_max=j_max, role_rank=role_rank)
    ]


def calls_on_paths(shape: TreeShape, paths: Iterable[SelectedPath]) -> list[int]:
    """The seqs of the calls whose tokens the paths use: the only blobs replay must read."""
    return sorted(
        {shape.seg_owner[bisect.bisect_right(shape.seg_start, a) - 1] for p in paths for a, _ in p.spans}
    )


def covers(calls: CallShapes, heads: Sequence[ChainHead]) -> bool:
    """Whether the projection has a row for every call the chains name."""
    return len(calls) > max(h.last_seq for h in heads)
