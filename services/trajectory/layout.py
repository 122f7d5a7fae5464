"""The shape of an execution tree without its tokens, rebuilt from the stored projection (pure).

Replay does not need a tree that can match new prompts; it needs the selected trajectories'
paths as buffer ranges and the tokens on those ranges. Ingest therefore stores, per call, where
its new prompt and new output hang in the tree (`CallShape`, the `tree_calls` projection). The
buffer is the calls' new tokens in seq order (each call appends its new prompt, then its new
output), so segment offsets are a cumulative sum and no prompt is matched again: loading the
shape of a 1M-token execution is a few numpy operations over its ~500 calls. Only the calls
that own a segment on a selected path then need their token blob read and decompressed.

Example (the tree of tree.py's docstring):
    CallShape(seq=0, new prompt 3, new output 2, prompt_attach=ROOT, output_attach=2)
    CallShape(seq=1, new prompt 1, new output 1, prompt_attach=4, output_attach=5)
    -> segments start [0, 3, 5, 6], parent [ROOT, 2, 4, 5], owner [0, 0, 1, 1]
    -> path_spans(shape, 6) == [(0, 3), (3, 5), (5, 6), (6, 7)]
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from services.trajectory.records import Float32Array, Int32Array, Int64Array
from services.trajectory.tree import ROOT, ExecutionTree

Span = tuple[int, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallShape:
    """One row of the `tree_calls` projection: where a call's new tokens sit in the tree."""

    seq: int
    num_new_prompt: int
    num_new_output: int
    prompt_attach: int
    """Position the new prompt tokens hang below (ROOT at the top; the prompt's end if none)."""
    output_attach: int
    """Position the new output tokens hang below (the call's end if none are new)."""
    chain: int


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
    """Segments of the flat buffer (sorted by start) and every call's start and end position."""

    seg_start: list[int]
    seg_parent: list[int]
    seg_owner: list[int]
    call_start: list[int]
    """Buffer position of each call's first new token (new prompt first, then new output)."""
    call_end: list[int]
    """Position of each call's last token (prompt + output), as `PlacedCall.end`."""
    n: int


def call_shapes(tree: ExecutionTree) -> list[CallShape]:
    """The projection rows of a tree that was built by ingest or folded from the log."""
    out = []
    for c in tree.calls:
        num_new_prompt = c.prompt_len - c.num_shared_prompt
        # New output tokens form one segment that ends at the call's end.
        num_new_output = c.end - tree.seg_start[tree.seg_of(c.end)] + 1 if c.end != c.output_attach else 0
        out.append(
            CallShape(
                seq=c.seq,
                num_new_prompt=num_new_prompt,
                num_new_output=num_new_output,
                prompt_attach=c.prompt_attach,
                output_attach=c.output_attach,
                chain=c.chain,
            )
        )
    return out


def tree_shape(calls: Sequence[CallShape]) -> TreeShape:
    """Lay the calls' segments out in the buffer (calls in seq order, every seq once)."""
    if [c.seq for c in calls] != list(range(len(calls))):
        raise ValueError("tree_calls rows must be every seq from 0, in order")
    new_prompt = np.fromiter((c.num_new_prompt for c in calls), np.int64, len(calls))
    new_output = np.fromiter((c.num_new_output for c in calls), np.int64, len(calls))
    prompt_attach = np.fromiter((c.prompt_attach for c in calls), np.int64, len(calls))
    output_attach = np.fromiter((c.output_attach for c in calls), np.int64, len(calls))
    sizes = new_prompt + new_output
    call_start = np.cumsum(sizes) - sizes
    seqs = np.arange(len(calls), dtype=np.int64)
    has_prompt, has_output = new_prompt > 0, new_output > 0
    # A call's prompt segment precedes its output segment, and calls come in buffer order, so
    # (start) sorts the segments; starts are distinct because segments are never empty.
    starts = np.concatenate([call_start[has_prompt], (call_start + new_prompt)[has_output]])
    parents = np.concatenate([prompt_attach[has_prompt], output_attach[has_output]])
    owners = np.concatenate([seqs[has_prompt], seqs[has_output]])
    order = np.argsort(starts, kind="stable")
    call_end = np.where(has_output, call_start + sizes - 1, output_attach)
    return TreeShape(
        seg_start=starts[order].tolist(),
        seg_parent=parents[order].tolist(),
        seg_owner=owners[order].tolist(),
        call_start=call_start.tolist(),
        call_end=call_end.tolist(),
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


def span_owners(shape: TreeShape, spans: Iterable[Span]) -> set[int]:
    """The calls whose new tokens cover the spans (a span never crosses a segment)."""
    return {shape.seg_owner[bisect.bisect_right(shape.seg_start, a) - 1] for a, _ in spans}


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
    call: CallShape,
    *,
    new_prompt_ids: Int32Array,
    new_output_ids: Int32Array,
    new_output_logprobs: Float32Array,
    new_output_versions: Int64Array,
) -> None:
    """Write one call's new tokens where `tree_shape` put them (as `fold_stored` appends them)."""
    if len(new_prompt_ids) != call.num_new_prompt or len(new_output_ids) != call.num_new_output:
        raise ValueError(f"call {call.seq}: stored blob disagrees with its tree_calls row")
    start = shape.call_start[call.seq]
    mid = start + call.num_new_prompt
    stop = mid + call.num_new_output
    buffers.tokens[start:mid] = new_prompt_ids
    buffers.tokens[mid:stop] = new_output_ids
    buffers.target[mid:stop] = True
    buffers.logprob[mid:stop] = new_output_logprobs
    buffers.version[mid:stop] = new_output_versions
