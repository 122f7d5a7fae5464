"""The warm start: scripted agent transcripts, supervised through the trainer's step, cached."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from gyre_app.warmstart.build import WarmStartConfig, cached_warm_start, each, install, verify
from gyre_app.warmstart.scripted import LOOK_AROUND, RecordedCall, record_transcript
from gyre_app.warmstart.tokens import chains, render_transcript, supervised_samples
from gyre_app.warmstart.train import TrainConfig
from services.engine.model_init import build_tokenizer
from services.evaluator.generate.families import build, plan
from services.trainer.loss import SUPERVISED, LossConfig, TokenTargets, microbatch_loss
from services.trainer.microbatch import microbatch_gradient
from services.trainer.policy import build_model, flat_logprobs, tiny_config


def tool_names(calls: list[RecordedCall]) -> list[str]:
    return [c.reply["tool_calls"][0]["function"]["name"] if c.reply.get("tool_calls") else "-" for c in calls]


def test_the_scripted_solver_runs_the_agent_through_a_delegation_and_a_compaction() -> None:
    repo_gen = next(p for p in plan(["repo-gen"], count=8) if build(p, seed=0).delegate)
    calls = record_transcript(build(repo_gen, seed=0), context_tokens=300)
    roles = [(c.role, c.agent_id) for c in calls]
    assert ("sub", "sub-1") in roles and ("summary", "main") in roles
    assert tool_names(calls)[:3] == ["write_file", "delegate", "write_file"]  # the sub-agent writes core.py
    # the delegation's result reached the main agent as the tool's answer
    after = next(
        c
        for c in calls
        if c.role == "main"
        and any(m.get("role") == "tool" and "sub-agent sub-1" in m["content"] for m in c.messages)
    )
    assert after is not None
    repair = record_transcript(build(plan(["repair"], count=1)[0], seed=0), context_tokens=24000)
    assert tool_names(repair) == ["read_file", "write_file", "run_tests", "-"]
    assert "passed" in repair[-1].messages[-1]["content"]  # the real tests ran on the fixed code


def test_an_imperfect_demonstration_declares_the_work_done_before_its_last_write() -> None:
    terminal = build(plan(["terminal"], count=1)[0], seed=0)
    early = record_transcript(terminal, context_tokens=24000, stop_early=True)
    assert tool_names(early) == ["shell", "-"]  # the result file, then "done": no rows.txt
    assert "result.txt" in early[0].reply["tool_calls"][0]["function"]["arguments"]
    repo_gen = next(p for p in plan(["repo-gen"], count=8) if build(p, seed=0).delegate)
    cut = record_transcript(build(repo_gen, seed=0), context_tokens=24000, stop_early=True)
    assert tool_names(cut) == ["write_file", "-"] and {c.agent_id for c in cut} == {"main"}
    repair = record_transcript(
        build(plan(["repair"], count=1)[0], seed=0), context_tokens=24000, stop_early=True
    )
    assert tool_names(repair) == ["read_file", "-"]  # the fix is never written


def test_a_wandering_demonstration_looks_around_first_and_runs_out_of_a_tight_turn_budget() -> None:
    terminal = build(plan(["terminal"], count=1)[0], seed=0)
    slow = record_transcript(terminal, context_tokens=24000, wander=True)
    # result.txt, then ls and data.csv again, then rows.txt and "done"
    assert tool_names(slow) == ["shell", "shell", "read_file", "shell", "-"]
    assert "name," in slow[3].messages[-1]["content"]  # the file's text came back to the agent
    assert slow[1].reply["content"] == LOOK_AROUND  # the detour is announced: chosen at its first token
    # under the demo's budget (the reference's two tool calls and its answer) it is cut after one write
    cut = record_transcript(terminal, context_tokens=24000, wander=True, max_turns=3)
    assert tool_names(cut) == ["shell", "shell", "read_file"]
    assert "result.txt" in cut[0].reply["tool_calls"][0]["function"]["arguments"]
    # a delegation still follows the look-arounds
    repo_gen = next(p for p in plan(["repo-gen"], count=8) if build(p, seed=0).delegate)
    delegated = record_transcript(build(repo_gen, seed=0), context_tokens=24000, wander=True)
    assert tool_names(delegated)[:4] == ["write_file", "shell", "read_file", "delegate"]


def test_chains_split_at_compaction_and_sub_agents_and_only_replies_are_targets() -> None:
    repo_gen = next(p for p in plan(["repo-gen"], count=8) if build(p, seed=0).delegate)
    calls = record_transcript(build(repo_gen, seed=0), context_tokens=300)
    grouped = chains(calls)
    assert [(c[0].role, c[0].agent_id, len(c)) for c in grouped][:3] == [
        ("main", "main", 3),
        ("sub", "sub-1", 2),
        ("summary", "main", 1),
    ]
    tok = build_tokenizer()
    rendered = render_transcript(tok, calls)
    first = rendered[0]
    targets = tok.decode(
        [t for t, m in zip(first.token_ids, first.target, strict=True) if m], skip_special_tokens=False
    )
    assert targets.count("<tool_call>") == 3 and targets.count("<|im_end|>") == 3 and "# Tools" not in targets
    samples = supervised_samples([rendered], names=["t0"], version=5)
    assert sum(sum(s.token_weight) for s in samples) == pytest.approx(1.0)
    assert {s.execution_id for s in samples} == {"t0"} and all(set(s.policy_versions) == {5} for s in samples)


def test_the_supervised_loss_is_the_weighted_nll_and_an_unknown_mode_is_refused() -> None:
    targets = TokenTargets(
        token_ids_K=torch.tensor([1, 2]),
        old_logprobs_K=torch.zeros(2),
        weight_K=torch.tensor([0.0, 1.0]),
        advantage_K=torch.zeros(2),
        num_targets=1,
    )
    loss, _ = microbatch_loss(torch.tensor([-0.5, -2.0]), targets, LossConfig(mode=SUPERVISED))
    assert float(loss) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="unknown loss mode 'dpo'"):
        microbatch_loss(torch.zeros(2), targets, LossConfig(mode="dpo"))


def test_a_supervised_gradient_step_raises_the_targets_likelihood() -> None:
    model = build_model(tiny_config(vocab_size=64), seed=0)
    from gyre_app.warmstart.tokens import RenderedChain

    chain = RenderedChain(token_ids=tuple(range(3, 23)), target=(False,) * 10 + (True,) * 10)
    samples = supervised_samples([[chain]], names=["e"], version=0)
    with torch.no_grad():
        before = float(flat_logprobs(model, [chain.token_ids])[9:].sum())
    grad = microbatch_gradient(model, samples, LossConfig(mode=SUPERVISED)).grad_P
    with torch.no_grad():
        from services.trainer.microbatch import load_parameters_vector, parameters_vector

        load_parameters_vector(model, parameters_vector(model) - 0.05 * grad.float())
        assert float(flat_logprobs(model, [chain.token_ids])[9:].sum()) > before


def test_the_warm_start_is_cached_by_its_inputs_and_a_corrupt_cache_is_rebuilt(tmp_path: Path) -> None:
    config = WarmStartConfig(
        seed=3,
        counts=each(["repo-gen", "repair", "terminal"], 4),
        train=TrainConfig(steps=2, transcripts_per_step=2),
    )
    said: list[str] = []
    folder, built = cached_warm_start(tmp_path, config, say=said.append)
    assert built and verify(folder) == "" and any("recorded 9 scripted transcripts" in m for m in said)
    manifest = json.loads((folder / "warmstart.json").read_text())
    assert manifest["train"]["steps"] == 2 and manifest["inputs"]["config"]["seed"] == 3
    assert cached_warm_start(tmp_path, config) == (folder, False)

    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])  # truncated
    assert "model.safetensors" in verify(folder)
    again, rebuilt = cached_warm_start(tmp_path, config, say=said.append)
    assert rebuilt and again == folder and verify(folder) == ""
    assert any("is corrupt" in m for m in said)

    other, _ = cached_warm_start(tmp_path, dataclasses.replace(config, seed=4))
    assert other != folder  # another input, another build
    target = tmp_path / "model"
    install(folder, target)
    assert (target / "config.json").read_bytes() == (folder / "config.json").read_bytes()
    assert json.loads((target / "config.json").read_text())["max_position_embeddings"] >= 65536
