"""`python -m bench.trainer --json`: DP exactness, tree packing speed, learning, step and publish times.

Everything runs on CPU with the tiny Qwen2 model, one torch thread per process; satellites are
real processes talking gloo over 127.0.0.1. Figures vary with machine load.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import PreTrainedModel

from services.trainer.dp import DataParallelCore
from services.trainer.lora import LoraSpec, attach_lora
from services.trainer.loss import LossConfig
from services.trainer.microbatch import microbatch_gradient, plan_microbatches
from services.trainer.packing import pack_sequences
from services.trainer.policy import build_model, flat_logprobs, tiny_config
from services.trainer.samples import Sample
from services.trainer.steps import OptimConfig, PolicyTrainer, make_optimizer
from services.trainer.synthetic import synthetic_executions
from services.trainer.weights import publish


def on_policy(samples: list[Sample], model: PreTrainedModel) -> list[Sample]:
    import dataclasses

    out = []
    with torch.no_grad():
        for s in samples:
            lp = flat_logprobs(model, [s.token_ids]).tolist()
            old = (0.0, *(v if m else 0.0 for v, m in zip(lp, s.loss_mask[1:], strict=True)))
            out.append(dataclasses.replace(s, old_logprobs=old))
    return out


def satellite(core: DataParallelCore, cell: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.trainer.satellite",
            "--rendezvous",
            core.rendezvous_uri,
            "--cell-id",
            cell,
        ],
        stderr=subprocess.DEVNULL,
    )


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def bench_dp() -> dict[str, object]:
    model = build_model(tiny_config(), seed=0)
    samples = on_policy(
        synthetic_executions(
            seed=3,
            num_executions=8,
            trajectories_per_execution=3,
            stem_tokens=96,
            branch_tokens=32,
            vocab_size=512,
        ),
        model,
    )
    mbs = plan_microbatches(samples, max_tokens=100_000)
    core = DataParallelCore(model_config=model.config, loss_config=LossConfig(), timeout_s=120)
    step_time: dict[str, float] = {}
    t0 = time.perf_counter()
    alone = core.compute_step_gradient(model, mbs, version=1)
    step_time["1"] = time.perf_counter() - t0
    procs = [satellite(core, "cell-1"), satellite(core, "cell-2")]
    try:
        one = core.compute_step_gradient(
            model, mbs, version=2, after_microbatch=lambda i: i == 1 and core.request_join("cell-1") and None
        )
        core.request_leave("cell-1").result(timeout=60)
        procs[0].wait(timeout=60)
        procs[0] = satellite(core, "cell-1")

        done_by_core = [0]

        def two_at(i: int) -> None:  # cell-1 after the core's first microbatch, cell-2 after its second
            done_by_core[0] += 1
            if done_by_core[0] in (1, 2):
                core.request_join(f"cell-{done_by_core[0]}")

        two = core.compute_step_gradient(model, mbs, version=3, after_microbatch=two_at)
        for n_members, version in ((3, 4), (3, 5)):  # warm group, then timed
            t0 = time.perf_counter()
            core.compute_step_gradient(model, mbs, version=version)
            step_time[str(n_members)] = time.perf_counter() - t0
        core.request_leave("cell-2").result(timeout=60)
        t0 = time.perf_counter()
        core.compute_step_gradient(model, mbs, version=6)
        step_time["2"] = time.perf_counter() - t0
        core.request_leave("cell-1").result(timeout=60)
    finally:
        for p in procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
    return {
        "dp_grad_max_rel_diff": max(rel_diff(one.grad_P, alone.grad_P), rel_diff(two.grad_P, alone.grad_P)),
        "dp_world_sizes_seen": [alone.max_world_size, one.max_world_size, two.max_world_size],
        "dp_num_microbatches": len(mbs),
        "step_time_s": {k: round(v, 4) for k, v in sorted(step_time.items())},
    }


def bench_packing(reps: int) -> dict[str, float | int]:
    """Forward+backward of whole executions, flattened vs tree-packed; median of `reps` after a warm-up.

    Each execution has a 512-token stem shared by 6 trajectories of 48 own tokens (an agent's
    retries and sub-agents): 3360 flattened tokens for 800 unique ones (ratio 4.2).
    """
    model = build_model(tiny_config(), seed=0)
    samples = on_policy(
        synthetic_executions(
            seed=5,
            num_executions=2,
            trajectories_per_execution=6,
            stem_tokens=512,
            branch_tokens=48,
            vocab_size=512,
        ),
        model,
    )
    mbs = plan_microbatches(samples, max_tokens=100_000)
    flat_tokens = sum(len(s.token_ids) for s in samples)
    unique = sum(pack_sequences([s.token_ids for s in mb]).num_nodes for mb in mbs)
    if flat_tokens < 2 * unique:
        raise AssertionError(
            f"the packing benchmark needs flat >= 2 x unique tokens, got {flat_tokens}/{unique}"
        )
    for packed in (False, True):  # warm-up: allocator and kernels, not timed
        microbatch_gradient(model, mbs[0], LossConfig(), packed=packed)
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(reps):
        for packed in (False, True):
            t0 = time.perf_counter()
            for mb in mbs:
                microbatch_gradient(model, mb, LossConfig(), packed=packed)
            times[packed].append(time.perf_counter() - t0)
    flat_s, packed_s = statistics.median(times[False]), statistics.median(times[True])
    return {
        "flat_to_unique_token_ratio": round(flat_tokens / unique, 3),
        "flat_fwd_bwd_s": round(flat_s, 4),
        "packed_fwd_bwd_s": round(packed_s, 4),
        "tree_packed_speedup_vs_flat": round(flat_s / packed_s, 3),
        "packing_reps": reps,
    }


def bench_learning(
    steps: int, seed: int, *, lora: LoraSpec | None = None, learning_rate: float = 1e-2
) -> dict[str, object]:
    """Verifiable task: after a 2-token prompt, each of 4 generated tokens earns 1/4 when it is below 256.

    `lora`: train LoRA adapters on the frozen model instead of every weight (bench.workflow)."""
    model = build_model(tiny_config(), seed=seed)
    if lora is not None:
        model = attach_lora(model, lora, seed=seed)
    config = OptimConfig(learning_rate=learning_rate, max_grad_norm=1.0, loss=LossConfig())
    core = DataParallelCore(model_config=model.config, loss_config=config.loss)
    trainer = PolicyTrainer(model, make_optimizer(model, config), config, core, version=0)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    prompts, group, completion = 4, 8, 4
    rewards_by_step: list[float] = []
    for _ in range(steps):
        samples: list[Sample] = []
        step_rewards: list[float] = []
        for p in range(prompts):
            prompt = [rng.randrange(1, 100), rng.randrange(1, 100)]
            outs, rewards = [], []
            with torch.no_grad():
                for _g in range(group):
                    ids = list(prompt)
                    lps: list[float] = []
                    for _t in range(completion):
                        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
                        logp = torch.log_softmax(logits, dim=-1)
                        tok = int(torch.multinomial(logp.exp(), 1, generator=gen))
                        ids.append(tok)
                        lps.append(float(logp[tok]))
                    outs.append((ids, lps))
                    rewards.append(sum(t < 256 for t in ids[2:]) / completion)
            mean = sum(rewards) / group
            e_count = prompts * group
            for g, ((ids, lps), r) in enumerate(zip(outs, rewards, strict=True)):
                samples.append(
                    Sample(
                        execution_id=f"p{p}-g{g}",
                        trajectory_id=f"p{p}-g{g}/0",
                        agent_role="main",
                        token_ids=tuple(ids),
                        loss_mask=(False, False, *([True] * completion)),
                        token_weight=(0.0, 0.0, *([1.0 / (e_count * completion)] * completion)),
                        old_logprobs=(0.0, 0.0, *lps),
                        policy_versions=tuple([trainer.version] * len(ids)),
                        reward=r,
                        advantage=r - mean,
                    )
                )
            step_rewards.extend(rewards)
        trainer.step(samples)
        rewards_by_step.append(sum(step_rewards) / len(step_rewards))
    first, last = rewards_by_step[:5], rewards_by_step[-5:]
    return {
        "reward_gain": round(sum(last) / 5 - sum(first) / 5, 4),
        "reward_by_step": [round(r, 3) for r in rewards_by_step],
    }


def bench_publish(reps: int) -> dict[str, float]:
    model = build_model(tiny_config(), seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        times = []
        for v in range(reps):
            t0 = time.perf_counter()
            publish(model, Path(tmp), version=v)
            times.append(time.perf_counter() - t0)
    return {"weight_publish_s": round(statistics.median(times), 4)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    parser.add_argument("--steps", type=int, default=15, help="optimizer steps of the learning run")
    parser.add_argument("--reps", type=int, default=3)
    ns = parser.parse_args(argv)
    torch.set_num_threads(1)
    result: dict[str, object] = {}
    result.update(bench_packing(ns.reps))
    result.update(bench_publish(ns.reps))
    result.update(bench_learning(ns.steps, seed=0))
    result.update(bench_dp())
    if ns.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:32s} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
