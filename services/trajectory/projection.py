"""Fold call records into an execution tree, and the normalised log rows that rebuild it (pure).

Ingest (`place_record`) matches a record's prompt and output against the tree and stores only
what is new: the call log row (`StoredCall`) says which earlier call the prompt (and any output
prefix) shares, how many tokens, and carries the new ids. Rebuild (`fold_stored`) replays those
rows in order without matching, so the tree it builds is the tree ingest built.

Example:
    c0 full prompt [1, 2, 3] out [100]           -> StoredCall(prompt_parent=-1, shared 0, new [1,2,3])
    c1 full prompt [1, 2, 3, 100, 4] out [101]   -> StoredCall(prompt_parent=0, shared 4, new [4])
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

import numpy as np

from services.trajectory.records import (
    CallMeta,
    CallRecord,
    Float32Array,
    Int32Array,
    Int64Array,
    PromptDelta,
)
from services.trajectory.tree import ROOT, ExecutionTree, PlacedCall

SELF = -2  # output_parent value: the output starts right after the call's own prompt


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredCall:
    """One row of the append-only call log: a record, normalised against the calls before it."""

    execution_id: str
    seq: int
    call_id: str
    agent_role: str
    agent_id: str
    prompt_parent: int
    """seq of the call whose prompt + output shares the first `num_shared_prompt` tokens; -1: none."""
    num_shared_prompt: int
    new_prompt_ids: Int32Array
    output_parent: int
    """seq of the call sharing the output's first `num_shared_output` tokens; SELF when none."""
    num_shared_output: int
    new_output_ids: Int32Array
    output_logprobs: Float32Array
    """The call's own log-probabilities for every output token (shared ones included)."""
    output_versions: Int64Array
    """Policy version of every output token."""
    policy_version: int
    meta: CallMeta

    @property
    def num_new_prompt(self) -> int:
        return len(self.new_prompt_ids)

    @property
    def prompt_len(self) -> int:
        return self.num_shared_prompt + len(self.new_prompt_ids)

    @property
    def output_len(self) -> int:
        return len(self.output_logprobs)


def place_record(tree: ExecutionTree, record: CallRecord) -> StoredCall:
    """Grow the tree by one record and return its log row; InvalidArgument leaves the tree as it was."""
    if record.call_id in tree.call_seq:
        raise ValueError(f"call {record.call_id} is already in the tree; deduplicate before placing")
    if isinstance(record.prompt, PromptDelta):
        delta = record.prompt
        parent = tree.call(delta.parent_call_id, field_name="prompt_delta.parent_call_id")
        start = tree.prefix_position(
            parent, delta.num_shared_tokens, field_name="prompt_delta.num_shared_tokens"
        )
        rest, shared_before = delta.new_ids, delta.num_shared_tokens
    else:
        start, rest, shared_before = ROOT, record.prompt, 0
    # Every check that can fail is above: from here on the tree only grows.
    seq = len(tree.calls)
    pos, matched = tree.match(start, rest)
    num_shared_prompt = shared_before + matched
    prompt_parent = tree.owner_of(pos) if pos != ROOT else -1
    new_prompt = rest[matched:]
    prompt_end = tree.append_segment(pos, new_prompt, owner=seq) if len(new_prompt) else pos

    versions = record.versions()
    out_pos, out_matched = tree.match(prompt_end, record.output_ids)
    output_parent = tree.owner_of(out_pos) if out_matched else SELF
    new_output = record.output_ids[out_matched:]
    end = out_pos
    if len(new_output):
        end = tree.append_segment(
            out_pos,
            new_output,
            owner=seq,
            logprobs=record.output_logprobs[out_matched:],
            versions=versions[out_matched:],
        )
    stored = StoredCall(
        execution_id=record.execution_id,
        seq=seq,
        call_id=record.call_id,
        agent_role=record.agent_role,
        agent_id=record.agent_id,
        prompt_parent=prompt_parent,
        num_shared_prompt=num_shared_prompt,
        new_prompt_ids=np.ascontiguousarray(new_prompt, np.int32),
        output_parent=output_parent,
        num_shared_output=out_matched,
        new_output_ids=np.ascontiguousarray(new_output, np.int32),
        output_logprobs=np.ascontiguousarray(record.output_logprobs, np.float32),
        output_versions=np.ascontiguousarray(versions, np.int64),
        policy_version=record.policy_version,
        meta=record.meta,
    )
    _add_placed(tree, stored, prompt_attach=pos, prompt_end=prompt_end, output_attach=out_pos, end=end)
    return stored


class LoggedCall(Protocol):
    """What folding a log row needs besides its tokens (a `StoredCall`, or a `CallHeader`)."""

    @property
    def seq(self) -> int: ...
    @property
    def call_id(self) -> str: ...
    @property
    def agent_role(self) -> str: ...
    @property
    def agent_id(self) -> str: ...
    @property
    def prompt_parent(self) -> int: ...
    @property
    def num_shared_prompt(self) -> int: ...
    @property
    def num_new_prompt(self) -> int: ...
    @property
    def output_parent(self) -> int: ...
    @property
    def num_shared_output(self) -> int: ...
    @property
    def prompt_len(self) -> int: ...
    @property
    def output_len(self) -> int: ...


class CallHeader(NamedTuple):
    """A log row without its token payload: enough to fold the tree's shape, chains and counts.

    A named tuple (immutable, and built at a third of a frozen dataclass's cost: one per call).
    """

    seq: int
    call_id: str
    agent_role: str
    agent_id: str
    prompt_parent: int
    num_shared_prompt: int
    num_new_prompt: int
    output_parent: int
    num_shared_output: int
    output_len: int

    @property
    def prompt_len(self) -> int:
        return self.num_shared_prompt + self.num_new_prompt


def fold_stored(tree: ExecutionTree, stored: StoredCall) -> None:
    """Replay one log row (rows must come in seq order)."""
    _fold(tree, stored, stored)


def fold_header(tree: ExecutionTree, header: LoggedCall) -> None:
    """Replay one log row's shape only (rows in seq order): the tree's positions, chains and
    counts come out as `fold_stored` makes them, and no token is read or stored."""
    _fold(tree, header, None)


def _fold(tree: ExecutionTree, call: LoggedCall, tokens: StoredCall | None) -> None:
    seq = call.seq
    assert seq == len(tree.calls), f"call log out of order at seq {seq}"
    pos = ROOT
    if call.num_shared_prompt:
        pos = tree.ancestor_at(tree.calls[call.prompt_parent].end, call.num_shared_prompt - 1)
    prompt_attach = pos
    if call.num_new_prompt:
        if tokens is None:
            pos = tree.grow(pos, call.num_new_prompt, owner=seq)
        else:
            pos = tree.append_segment(pos, tokens.new_prompt_ids, owner=seq)
    prompt_end = pos
    if call.output_parent != SELF:
        depth = call.prompt_len + call.num_shared_output - 1
        pos = tree.ancestor_at(tree.calls[call.output_parent].end, depth)
    output_attach = pos
    k = call.num_shared_output
    if call.output_len > k:
        if tokens is None:
            pos = tree.grow(pos, call.output_len - k, owner=seq)
        else:
            pos = tree.append_segment(
                pos,
                tokens.new_output_ids,
                owner=seq,
                logprobs=tokens.output_logprobs[k:],
                versions=tokens.output_versions[k:],
            )
    _add_placed(
        tree, call, prompt_attach=prompt_attach, prompt_end=prompt_end, output_attach=output_attach, end=pos
    )


def _add_placed(
    tree: ExecutionTree,
    stored: LoggedCall,
    *,
    prompt_attach: int,
    prompt_end: int,
    output_attach: int,
    end: int,
) -> None:
    chain = tree.chain_for(
        agent_role=stored.agent_role,
        agent_id=stored.agent_id,
        prompt_end=prompt_end,
        prompt_len=stored.prompt_len,
    )
    tree.add_call(
        PlacedCall(
            seq=stored.seq,
            call_id=stored.call_id,
            agent_role=stored.agent_role,
            agent_id=stored.agent_id,
            prompt_len=stored.prompt_len,
            output_len=stored.output_len,
            prompt_end=prompt_end,
            end=end,
            num_shared_prompt=stored.num_shared_prompt,
            prompt_attach=prompt_attach,
            output_attach=output_attach,
            chain=chain,
        )
    )


def build_tree(execution_id: str, rows: Iterable[StoredCall]) -> ExecutionTree:
    tree = ExecutionTree(execution_id)
    for row in rows:
        fold_stored(tree, row)
    return tree


def build_shape(execution_id: str, headers: Iterable[LoggedCall]) -> ExecutionTree:
    """The tree of `build_tree` without its tokens: calls, chains, positions and counts only."""
    tree = ExecutionTree(execution_id, capacity=0)
    for header in headers:
        fold_header(tree, header)
    return tree


def call_tokens(tree: ExecutionTree, seq: int) -> tuple[Int32Array, Int32Array]:
    """The exact (prompt_ids, output_ids) of a call, read back from the tree."""
    call = tree.calls[seq]
    ids = tree.tokens[tree.path(call.end)]
    return ids[: call.prompt_len], ids[call.prompt_len :]
