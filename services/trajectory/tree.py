"""An execution's token trie, its trajectories and J_max selection (pure).

Every distinct tree position is stored once in one flat buffer (`tokens`, with `target`,
`logprob`, `version` alongside). The buffer is a list of contiguous *segments*; a segment hangs
below a parent position (-1 is the root) and is either context (new prompt tokens of a call) or
target (new output tokens the engine generated). A position's path is found by walking segment
parents, so a call's exact prompt and output are a gather over the buffer.

Matching a prompt follows the longest stored path: inside a segment the next token is the next
buffer entry; at a branch point `children[pos]` maps a first token to the segment starting there.
Positions are never split or moved, so segments are immutable once written.

Example (context ids < 100, policy ids >= 100):
    c0: prompt [1, 2, 3] output [100, 101]      -> segments s0=[1,2,3] (ctx), s1=[100,101] (target)
    c1: prompt [1, 2, 3, 100, 101, 4] out [102]  -> matches s0+s1, adds s2=[4] (ctx), s3=[102]
    c2: prompt [1, 2, 9]  (a retry forked early) -> branches off s0 at its second token
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, TypeVar

import numpy as np

from gyre.errors import InvalidArgument
from services.trajectory.records import DEFAULT_ROLE_RANK, ROLES, Float32Array, Int32Array, Int64Array

ROOT = -1


class ParentNotStored(InvalidArgument):
    """A delta names a call the tree does not hold (yet): its record may still be on the way."""


class PlacedCall(NamedTuple):
    """A call as stored in the tree: where its prompt and output end, and how much was shared.

    A named tuple rather than a frozen dataclass: a fold makes one per call, and a frozen
    dataclass costs about three times as much to build.
    """

    seq: int
    call_id: str
    agent_role: str
    agent_id: str
    prompt_len: int
    output_len: int
    prompt_end: int
    """Buffer position of the last prompt token; ROOT for an empty prompt."""
    end: int
    """Buffer position of the last output token (the prompt's end when the output is empty)."""
    num_shared_prompt: int
    """Leading prompt tokens that were already in the tree."""
    prompt_attach: int
    """Position the call's new prompt tokens hang below (its prompt's end when none are new)."""
    output_attach: int
    """Position the call's new output tokens hang below (its end when none are new)."""
    chain: int
    """Index of the trajectory the call belongs to."""

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.output_len


@dataclass(slots=True, kw_only=True)
class Chain:
    """A trajectory: a maximal chain of one agent's calls, each extending the previous one."""

    index: int
    agent_role: str
    agent_id: str
    call_seqs: list[int] = field(default_factory=list)

    @property
    def first_seq(self) -> int:
        return self.call_seqs[0]

    @property
    def last_seq(self) -> int:
        return self.call_seqs[-1]


class ExecutionTree:
    """Mutable trie of one execution; grows by `append_segment`, read by positions and paths."""

    def __init__(self, execution_id: str, capacity: int = 1024) -> None:
        self.execution_id = execution_id
        self.n = 0
        self.tokens: Int32Array = np.zeros(capacity, np.int32)
        self.target = np.zeros(capacity, np.bool_)
        self.logprob: Float32Array = np.zeros(capacity, np.float32)
        self.version: Int64Array = np.zeros(capacity, np.int64)
        self.seg_start: list[int] = []
        self.seg_parent: list[int] = []
        self.seg_depth: list[int] = []
        self.seg_owner: list[int] = []
        # Each segment's ancestry (segment ids and their first depths, root first): a position at
        # a given depth on a path is then two bisects, not a walk up hundreds of segments. A
        # segment's ancestry is the first `seg_anc_len` entries of its lists, which it shares with
        # the segments below it: one that extends its parent's tip appends to the parent's lists
        # instead of copying them (a chain of calls then costs O(1) per segment, not O(depth)).
        self.seg_anc: list[list[int]] = []
        self.seg_anc_depth: list[list[int]] = []
        self.seg_anc_len: list[int] = []
        self.children: dict[int, dict[int, int]] = {}
        self.calls: list[PlacedCall] = []
        self.call_seq: dict[str, int] = {}
        self.chains: list[Chain] = []
        self.agent_chains: dict[tuple[str, str], list[Chain]] = {}
        """Each agent's chains, so a new call is compared with its own agent's chains only."""
        self.num_flat_tokens = 0

    # -- positions -------------------------------------------------------------------------
    def seg_of(self, pos: int) -> int:
        return bisect.bisect_right(self.seg_start, pos) - 1

    def seg_end(self, seg: int) -> int:
        return self.seg_start[seg + 1] if seg + 1 < len(self.seg_start) else self.n

    def depth(self, pos: int) -> int:
        """0-based depth of a position: its path has depth + 1 tokens (ROOT has depth -1)."""
        if pos == ROOT:
            return -1
        seg = self.seg_of(pos)
        return self.seg_depth[seg] + pos - self.seg_start[seg]

    def ancestor_at(self, pos: int, depth: int) -> int:
        """The position at `depth` on the path to `pos` (ROOT for depth -1)."""
        if depth < 0:
            return ROOT
        seg = self.seg_of(pos)
        owner = self.seg_anc[seg][
            bisect.bisect_right(self.seg_anc_depth[seg], depth, 0, self.seg_anc_len[seg]) - 1
        ]
        return self.seg_start[owner] + depth - self.seg_depth[owner]

    def path_spans(self, pos: int) -> list[tuple[int, int]]:
        """The path from the root down to `pos` as buffer ranges [start, stop), root first.

        Each ancestor segment is used up to where the next one branches off; the last up to `pos`.
        """
        if pos == ROOT:
            return []
        seg = self.seg_of(pos)
        anc = self.seg_anc[seg][: self.seg_anc_len[seg]]
        stops = [self.seg_parent[s] + 1 for s in anc[1:]]
        stops.append(pos + 1)
        return [(self.seg_start[s], stop) for s, stop in zip(anc, stops, strict=True)]

    def path(self, pos: int) -> Int64Array:
        """Buffer positions from the root down to `pos`, inclusive."""
        spans = self.path_spans(pos)
        if not spans:
            return np.zeros(0, np.int64)
        starts = np.fromiter((a for a, _ in spans), np.int64, len(spans))
        lengths = np.fromiter((b for _, b in spans), np.int64, len(spans)) - starts
        total = int(lengths.sum())
        # arange per range without a Python loop: offsets restart at each range's start.
        shift = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
        positions: Int64Array = np.arange(total, dtype=np.int64) + shift
        return positions

    def owner_of(self, pos: int) -> int:
        return self.seg_owner[self.seg_of(pos)]

    # -- matching and growth ----------------------------------------------------------------
    def match(self, pos: int, ids: Int32Array) -> tuple[int, int]:
        """Follow `ids` down from `pos` as far as the tree holds them: (last position, matched)."""
        matched, n = 0, len(ids)
        while matched < n:
            first = int(ids[matched])
            run_start = -1
            if pos != ROOT:
                seg = self.seg_of(pos)
                if pos + 1 < self.seg_end(seg) and int(self.tokens[pos + 1]) == first:
                    run_start, run_end = pos + 1, self.seg_end(seg)
            if run_start < 0:
                child = self.children.get(pos, {}).get(first)
                if child is None:
                    break
                run_start, run_end = self.seg_start[child], self.seg_end(child)
            length = min(run_end - run_start, n - matched)
            differ = np.flatnonzero(
                self.tokens[run_start : run_start + length] != ids[matched : matched + length]
            )
            step = int(differ[0]) if differ.size else length
            pos, matched = run_start + step - 1, matched + step
        return pos, matched

    def append_segment(
        self,
        parent: int,
        ids: Int32Array,
        *,
        owner: int,
        logprobs: Float32Array | None = None,
        versions: Int64Array | None = None,
    ) -> int:
        """Store `ids` below `parent` (targets when logprobs are given); returns the last position."""
        k = len(ids)
        assert k > 0
        self._reserve(self.n + k)
        start = self.n
        self.tokens[start : start + k] = ids
        if logprobs is not None:
            assert versions is not None
            self.target[start : start + k] = True
            self.logprob[start : start + k] = logprobs
            self.version[start : start + k] = versions
        siblings = self.children.setdefault(parent, {})
        assert int(ids[0]) not in siblings, "append only what `match` could not follow"
        siblings[int(ids[0])] = len(self.seg_start)
        return self.grow(parent, k, owner=owner)

    def grow(self, parent: int, k: int, *, owner: int) -> int:
        """Add a segment of `k` positions below `parent` without tokens; returns its last position.

        The structure alone (positions, depths, ancestry): what folding the log's projections
        needs. A tree grown only this way holds no tokens and cannot `match`.
        """
        start = self.n
        seg = len(self.seg_start)
        self.seg_start.append(start)
        self.seg_parent.append(parent)
        self.seg_owner.append(owner)
        if parent == ROOT:
            depth, anc, depths, n = 0, [seg], [0], 1
        else:
            parent_seg = self.seg_of(parent)
            depth = self.seg_depth[parent_seg] + parent - self.seg_start[parent_seg] + 1
            anc, depths, n = (
                self.seg_anc[parent_seg],
                self.seg_anc_depth[parent_seg],
                self.seg_anc_len[parent_seg],
            )
            if len(anc) == n:  # nothing hangs below the parent's ancestry yet: share it
                anc.append(seg)
                depths.append(depth)
            else:  # a branch: the parent's ancestry goes on elsewhere
                anc, depths = [*anc[:n], seg], [*depths[:n], depth]
            n += 1
        self.seg_depth.append(depth)
        self.seg_anc.append(anc)
        self.seg_anc_depth.append(depths)
        self.seg_anc_len.append(n)
        self.n += k
        return start + k - 1

    def _reserve(self, size: int) -> None:
        if size <= len(self.tokens):
            return
        capacity = max(size, 2 * len(self.tokens))
        for name in ("tokens", "target", "logprob", "version"):
            old = getattr(self, name)
            new = np.zeros(capacity, old.dtype)
            new[: self.n] = old[: self.n]
            setattr(self, name, new)

    # -- calls and chains --------------------------------------------------------------------
    def call(self, call_id: str, *, field_name: str) -> PlacedCall:
        seq = self.call_seq.get(call_id)
        if seq is None:
            raise ParentNotStored(
                field_name, f"no call {call_id!r} recorded earlier in execution {self.execution_id}"
            )
        return self.calls[seq]

    def prefix_position(self, parent: PlacedCall, num_shared: int, *, field_name: str) -> int:
        """Position of the last of `parent`'s first `num_shared` prompt + output tokens."""
        if num_shared > parent.num_tokens:
            raise InvalidArgument(
                field_name,
                f"{num_shared} shared tokens, but call {parent.call_id!r} has only "
                f"{parent.num_tokens} prompt + output tokens",
            )
        return self.ancestor_at(parent.end, num_shared - 1)

    def add_call(self, call: PlacedCall) -> None:
        self.calls.append(call)
        self.call_seq[call.call_id] = call.seq
        self.num_flat_tokens += call.num_tokens
        if call.chain == len(self.chains):
            chain = Chain(index=call.chain, agent_role=call.agent_role, agent_id=call.agent_id)
            self.chains.append(chain)
            self.agent_chains.setdefault((call.agent_role, call.agent_id), []).append(chain)
        self.chains[call.chain].call_seqs.append(call.seq)

    def chain_for(self, *, agent_role: str, agent_id: str, prompt_end: int, prompt_len: int) -> int:
        """The chain a new call extends (its prompt starts with the chain's last prompt + output).

        Among several, the one whose last call is longest (then the latest) wins; none: a new one.
        """
        best, best_key = len(self.chains), (-1, -1)
        for chain in self.agent_chains.get((agent_role, agent_id), ()):
            last = self.calls[chain.call_seqs[-1]]
            num_tokens = last.prompt_len + last.output_len
            if num_tokens > prompt_len:
                continue
            if num_tokens and self.ancestor_at(prompt_end, num_tokens - 1) != last.end:
                continue
            key = (num_tokens, last.seq)
            if key > best_key:
                best, best_key = chain.index, key
        return best

    @property
    def num_targets(self) -> int:
        return int(self.target[: self.n].sum())


class RankedChain(Protocol):
    """What selection needs of a chain (a tree's `Chain`, or a stored `ChainHead`)."""

    @property
    def agent_role(self) -> str: ...
    @property
    def first_seq(self) -> int: ...


C = TypeVar("C", bound=RankedChain)


def select_chains(chains: Sequence[C], *, j_max: int, role_rank: Sequence[str]) -> list[C]:
    """Keep at most j_max chains, best role first; ties go to the chain whose first call came first.

    Roles missing from `role_rank` are never selected (`role_rank=["main"]` keeps main only).
    First-call order is stable while an execution is still streaming in: a late call never
    displaces an earlier chain of the same role.

    Example:
        chains: main#0, summary#1, main#2, sub/a#3;  j_max=3, rank=main>sub>summary
        -> [main#0, main#2, sub/a#3]
    """
    if j_max < 1:
        raise InvalidArgument("j_max", f"must be >= 1, got {j_max}")
    ranked = [c for c in chains if c.agent_role in role_rank]
    ranked.sort(key=lambda c: (role_rank.index(c.agent_role), c.first_seq))
    return ranked[:j_max]


def validate_role_rank(role_rank: Sequence[str]) -> tuple[str, ...]:
    if not role_rank:
        return DEFAULT_ROLE_RANK
    for i, role in enumerate(role_rank):
        if role not in ROLES:
            raise InvalidArgument(f"role_rank[{i}]", f"must be one of {', '.join(ROLES)}, got {role!r}")
    if len(set(role_rank)) != len(role_rank):
        raise InvalidArgument("role_rank", "lists a role twice")
    return tuple(role_rank)
