"""The trajectory core on readable token ids: context ids < 100, policy (generated) ids >= 100."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from gyre.errors import InvalidArgument
from services.trajectory.layout import call_shapes
from services.trajectory.projection import CallHeader, build_shape, build_tree, call_tokens, place_record
from services.trajectory.records import CallRecord, PromptDelta, record_from_json
from services.trajectory.synthetic import SyntheticConfig, generate_execution
from services.trajectory.tree import ExecutionTree
from services.trajectory.weights import Outcome, group_advantages, replay_batch

RANK = ("main", "sub", "summary")


def call(
    cid: str,
    prompt: Sequence[int] | PromptDelta,
    output: Sequence[int],
    *,
    role: str = "main",
    agent: str | None = None,
    version: int = 1,
) -> CallRecord:
    return CallRecord(
        execution_id="e1",
        call_id=cid,
        agent_role=role,
        agent_id=agent or role,
        prompt=prompt if isinstance(prompt, PromptDelta) else np.array(prompt, np.int32),
        output_ids=np.array(output, np.int32),
        output_logprobs=np.full(len(output), -0.5, np.float32),
        policy_version=version,
    )


def delta(parent: str, shared: int, new: Sequence[int]) -> PromptDelta:
    return PromptDelta(parent_call_id=parent, num_shared_tokens=shared, new_ids=np.array(new, np.int32))


def grow(*records: CallRecord) -> ExecutionTree:
    tree = ExecutionTree("e1")
    for r in records:
        place_record(tree, r)
    return tree


def samples(tree: ExecutionTree, j_max: int = 5, rank: Sequence[str] = RANK) -> dict[str, list[list[int]]]:
    out = {}
    for s in replay_batch([tree], j_max=j_max, role_rank=rank, outcomes={}):
        out[s.trajectory_id] = [s.token_ids.tolist(), s.loss_mask.astype(int).tolist()]
    return out


def test_a_chain_of_calls_is_one_trajectory_with_every_output_a_target() -> None:
    tree = grow(
        call("c0", [1, 2], [100, 101]),
        call("c1", delta("c0", 4, [3]), [102]),
        call("c2", [1, 2, 100, 101, 3, 102, 4], [103]),  # full prompt, same path
    )
    assert tree.n == 8  # every token stored once
    assert tree.num_flat_tokens == 4 + 6 + 8
    assert [c.chain for c in tree.calls] == [0, 0, 0]
    assert samples(tree) == {
        "e1/0": [[1, 2, 100, 101, 3, 102, 4, 103], [0, 0, 1, 1, 0, 1, 0, 1]],
    }
    assert [c.num_shared_prompt for c in tree.calls] == [0, 4, 6]


def test_compaction_starts_a_new_trajectory_and_the_pasted_summary_is_context() -> None:
    tree = grow(
        call("c0", [1, 2], [100]),
        call("s0", delta("c0", 3, [9]), [110, 111], role="summary", agent="main"),
        # fresh context: system prompt + the summary pasted as plain text
        call("c1", [1, 2, 110, 111], [120]),
    )
    got = samples(tree)
    assert got["e1/0"] == [[1, 2, 100], [0, 0, 1]]
    assert got["e1/1"] == [[1, 2, 100, 9, 110, 111], [0, 0, 0, 0, 1, 1]]
    assert got["e1/2"] == [[1, 2, 110, 111, 120], [0, 0, 0, 0, 1]]  # 110, 111 are context here
    assert tree.calls[2].num_shared_prompt == 2


def test_sub_agents_have_their_own_trajectories() -> None:
    tree = grow(
        call("c0", [1, 2], [100]),
        call("a0", [5, 100], [130], role="sub", agent="a"),
        call("b0", [5, 6], [140], role="sub", agent="b"),
        call("a1", delta("a0", 3, [7]), [131], role="sub", agent="a"),
        call("c1", delta("c0", 3, [131]), [101]),  # the sub-agent's answer pasted back: context
    )
    assert [(c.agent_role, c.agent_id, c.call_seqs) for c in tree.chains] == [
        ("main", "main", [0, 4]),
        ("sub", "a", [1, 3]),
        ("sub", "b", [2]),
    ]
    got = samples(tree)
    assert got["e1/0"] == [[1, 2, 100, 131, 101], [0, 0, 1, 0, 1]]
    assert got["e1/1"] == [[5, 100, 130, 7, 131], [0, 0, 1, 0, 1]]


def test_a_retry_forks_a_new_trajectory_that_shares_the_prefix_and_counts_shared_targets_once() -> None:
    tree = grow(
        call("c0", [1], [100]),
        call("c1", delta("c0", 2, [2]), [101, 102]),  # failed attempt
        call("c1r", delta("c0", 2, [2]), [101, 103]),  # retry: same prompt, output forks at 2nd token
        call("c2", delta("c1r", 5, [3]), [104]),
    )
    assert [ch.call_seqs for ch in tree.chains] == [[0, 1], [2, 3]]
    assert tree.n == 8  # 1 100 2 101 102, then only 103 3 104 for the retry branch
    got = samples(tree)
    assert got["e1/0"] == [[1, 100, 2, 101, 102], [0, 1, 0, 1, 1]]
    # 100 and 101 are the same tree positions as in e1/0: counted there, not again
    assert got["e1/1"] == [[1, 100, 2, 101, 103, 3, 104], [0, 0, 0, 0, 1, 0, 1]]


def test_j_max_keeps_the_best_roles_first_then_the_earliest_chains() -> None:
    tree = grow(
        call("s0", [1], [110], role="summary", agent="main"),
        call("a0", [2], [120], role="sub", agent="a"),
        call("m0", [3], [100]),
        call("m1", [4], [101]),
        call("b0", [5], [130], role="sub", agent="b"),
    )
    assert list(samples(tree, j_max=3)) == ["e1/2", "e1/3", "e1/1"]
    assert list(samples(tree, j_max=5, rank=("sub",))) == ["e1/1", "e1/4"]
    with pytest.raises(InvalidArgument, match="j_max"):
        samples(tree, j_max=0)


def test_weights_average_tokens_per_execution_then_across_executions() -> None:
    one = grow(call("c0", [1], [100, 101]), call("c1", [1, 100, 101, 2], [102, 103]))
    two = ExecutionTree("e2")
    place_record(
        two, call("d0", [1], [100]).__class__(**{**_fields(call("d0", [1], [100])), "execution_id": "e2"})
    )
    batch = replay_batch([one, two], j_max=5, role_rank=RANK, outcomes={"e1": Outcome(reward=1.0)})
    weights = {s.execution_id: s.token_weight[s.loss_mask] for s in batch}
    assert np.allclose(weights["e1"], 1 / (2 * 4))  # E = 2, U_e1 = 4
    assert np.allclose(weights["e2"], 1 / (2 * 1))
    assert sum(float(s.token_weight.sum()) for s in batch) == pytest.approx(1.0)
    first = batch[0]
    assert first.old_logprobs.tolist() == [0, -0.5, -0.5, 0, -0.5, -0.5]
    assert first.policy_versions.tolist() == [0, 1, 1, 0, 1, 1]
    assert (first.reward, first.has_reward, batch[1].has_reward) == (1.0, True, False)


def _fields(r: CallRecord) -> dict[str, object]:
    return {k: getattr(r, k) for k in CallRecord.__slots__}


def test_advantages_are_group_relative() -> None:
    assert group_advantages({"a": 1.0, "b": 0.0}) == pytest.approx({"a": 1.0, "b": -1.0}, abs=1e-5)
    assert group_advantages({"a": 0.5, "b": 0.5}) == {"a": 0.0, "b": 0.0}
    assert group_advantages({"a": 1.0, "b": 0.0}, estimator="mean_centered") == {"a": 0.5, "b": -0.5}


def test_bad_deltas_are_refused_with_the_reason_and_leave_the_tree_as_it_was() -> None:
    tree = grow(call("c0", [1, 2], [100]))
    with pytest.raises(InvalidArgument, match="no call 'zz' recorded earlier") as unknown:
        place_record(tree, call("c1", delta("zz", 1, [3]), [101]))
    assert unknown.value.field == "prompt_delta.parent_call_id"
    with pytest.raises(InvalidArgument, match="4 shared tokens, but call 'c0' has only 3"):
        place_record(tree, call("c1", delta("c0", 4, [3]), [101]))
    assert (tree.n, len(tree.calls)) == (3, 1)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ({"call_id": "c"}, "execution_id: missing"),
        ({"prompt_ids": [1, -2]}, "token ids must be in 0..2^31-1, got -2 at index 1"),
        ({"output_logprobs": [-0.1]}, "has 1 entries, output_ids has 2"),
        ({"agent_role": "boss"}, "agent_role: must be one of main, sub, summary"),
    ],
)
def test_malformed_json_records_name_what_is_wrong(line: dict[str, object], reason: str) -> None:
    good = {
        "execution_id": "e1",
        "call_id": "c7",
        "agent_role": "main",
        "agent_id": "main",
        "prompt_ids": [1, 2, 3],
        "output_ids": [100, 101],
        "output_logprobs": [-0.1, -0.7],
        "policy_version": 4,
    }
    record_from_json(good)
    bad = {**good, **line}
    if line == {"call_id": "c"}:
        del bad["execution_id"]
    with pytest.raises(InvalidArgument, match=reason.replace("^", r"\^")):
        record_from_json(bad)


def test_a_synthetic_execution_rebuilds_exactly_from_its_log_rows() -> None:
    config = SyntheticConfig(
        seed=5, target_tokens=60_000, compaction_context_tokens=12_000, sub_agent_probability=0.2
    )
    records = generate_execution("e1", config=config)
    tree = ExecutionTree("e1")
    rows = [place_record(tree, r) for r in records]
    roles = {c.agent_role for c in tree.chains}
    assert roles == {"main", "sub", "summary"} and len(records) > 30
    assert any(r.meta.finish_reason == "cancelled" for r in records)  # retries happened
    rebuilt = build_tree("e1", rows)
    assert np.array_equal(rebuilt.tokens[: rebuilt.n], tree.tokens[: tree.n])
    assert [c.chain for c in rebuilt.calls] == [c.chain for c in tree.calls]
    full: dict[str, np.ndarray] = {}
    for r, row in zip(records, rows, strict=True):
        if isinstance(r.prompt, PromptDelta):
            parent = full[r.prompt.parent_call_id][: r.prompt.num_shared_tokens]
            prompt = np.concatenate([parent, r.prompt.new_ids])
        else:
            prompt = r.prompt
        full[r.call_id] = np.concatenate([prompt, r.output_ids])
        got_prompt, got_output = call_tokens(rebuilt, row.seq)
        assert np.array_equal(got_prompt, prompt) and np.array_equal(got_output, r.output_ids)
    assert tree.num_flat_tokens > 3 * tree.n


def test_folding_log_headers_without_tokens_gives_the_trees_projections() -> None:
    config = SyntheticConfig(
        seed=7, target_tokens=30_000, compaction_context_tokens=8_000, sub_agent_probability=0.3
    )
    tree = ExecutionTree("e1")
    rows = [place_record(tree, r) for r in generate_execution("e1", config=config)]
    headers = [
        CallHeader(
            seq=s.seq,
            call_id=s.call_id,
            agent_role=s.agent_role,
            agent_id=s.agent_id,
            prompt_parent=s.prompt_parent,
            num_shared_prompt=s.num_shared_prompt,
            num_new_prompt=s.num_new_prompt,
            output_parent=s.output_parent,
            num_shared_output=s.num_shared_output,
            output_len=s.output_len,
        )
        for s in rows
    ]
    shape = build_shape("e1", headers)
    assert len({c.agent_role for c in tree.chains}) == 3 and len(tree.chains) > 3
    assert shape.calls == tree.calls
    assert [(c.agent_role, c.agent_id, c.call_seqs) for c in shape.chains] == [
        (c.agent_role, c.agent_id, c.call_seqs) for c in tree.chains
    ]
    assert (shape.n, shape.num_flat_tokens) == (tree.n, tree.num_flat_tokens)
    got, want = call_shapes(shape), call_shapes(tree)
    for name in ("num_new_prompt", "num_new_output", "prompt_attach", "output_attach", "chain"):
        assert np.array_equal(getattr(got, name), getattr(want, name)), name
