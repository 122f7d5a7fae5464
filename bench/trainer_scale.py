"""`python -m bench.trainer_scale --json`: tree packing on 8k..64k-token execution trees (CPU, tiny model).

Each size runs in a fresh process, so its peak memory is its own: an agent-shaped execution tree
(`synthetic_agent_tree`: a long main chain with context compactions, sub-agents and retried
calls; no trajectory deeper than the model's 8192-token context) is trained forward and backward
as one packed microbatch. Per size: peak resident memory above the process's state before the
pass, forward+backward seconds, packed tokens per second, and the largest relative gradient
difference against the unpacked reference (each trajectory run on its own through the model's
own causal attention) where `--reference-max-tokens` allows. The largest tree then takes one
real optimizer step through `PolicyTrainer` (it "trains"). Last, a 16k-token microbatch is
encoded and decoded as it travels to satellites, packed arrays against the JSON form the trainer
used before (kept here as the baseline), median of several repetitions.

Figures vary with machine load; the ratios compare runs of one invocation.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

import torch

from services.trainer.dp import DataParallelCore
from services.trainer.loss import LossConfig, policy_loss, token_targets
from services.trainer.microbatch import (
    decode_microbatch,
    encode_microbatch,
    flat_parameters,
    microbatch_gradient,
)
from services.trainer.packing import pack_sequences
from services.trainer.policy import build_model, separate_logprobs, tiny_config
from services.trainer.samples import Sample
from services.trainer.steps import OptimConfig, PolicyTrainer, make_optimizer
from services.trainer.synthetic import synthetic_agent_tree

SIZES = (8192, 16384, 32768, 65536)
CONTEXT_TOKENS = 8192


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def tree(num_tokens: int) -> list[Sample]:
    return synthetic_agent_tree(seed=7, num_tokens=num_tokens, context_tokens=CONTEXT_TOKENS, vocab_size=512)


def reference_gradient(model: Any, samples: list[Sample]) -> torch.Tensor:
    for p in model.parameters():
        p.grad = None
    logprobs = separate_logprobs(model, [s.token_ids for s in samples])
    loss, _ = policy_loss(logprobs, token_targets(samples), LossConfig())
    loss.backward()
    return torch.cat([p.grad.reshape(-1).double() for p in flat_parameters(model)])


def one_size(num_tokens: int, *, reference: bool, train: bool) -> dict[str, Any]:
    """Runs in its own process: the figures of one tree size."""
    torch.set_num_threads(1)
    config = tiny_config()
    config.max_position_embeddings = CONTEXT_TOKENS
    model = build_model(config, seed=0)
    samples = tree(num_tokens)
    packed = pack_sequences([s.token_ids for s in samples])
    before_mib = rss_mib()
    t0 = time.perf_counter()
    result = microbatch_gradient(model, samples, LossConfig(), packed=True)
    fwd_bwd_s = time.perf_counter() - t0
    out: dict[str, Any] = {
        "num_tokens": packed.num_nodes,
        "num_flat_tokens": packed.num_flat_tokens,
        "num_trajectories": len(samples),
        "max_depth": max(packed.position_ids) + 1,
        "peak_mib": round(peak_rss_mib() - before_mib, 1),
        "fwd_bwd_s": round(fwd_bwd_s, 3),
        "tokens_per_s": round(packed.num_nodes / fwd_bwd_s, 1),
    }
    if reference:
        ref = reference_gradient(model, samples)
        out["max_rel_grad_diff"] = float((result.grad_P - ref).abs().max() / ref.abs().max())
    if train:
        optim = OptimConfig(microbatch_max_tokens=packed.num_nodes)
        core = DataParallelCore(model_config=model.config, loss_config=optim.loss)
        trainer = PolicyTrainer(model, make_optimizer(model, optim), optim, core, version=0)
        t0 = time.perf_counter()
        report = trainer.step(samples)
        out["trained_version"] = report.version
        out["train_step_s"] = round(time.perf_counter() - t0, 3)
    return out


def json_encode(samples: list[Sample]) -> bytes:
    """How microbatches travelled to satellites before packed arrays (the baseline)."""
    return json.dumps([asdict(s) for s in samples]).encode()


def json_decode(data: bytes) -> list[Sample]:
    out = []
    for d in json.loads(data):
        for name in ("token_ids", "loss_mask", "token_weight", "old_logprobs", "policy_versions"):
            d[name] = tuple(d[name])
        out.append(Sample(**d))
    return out


def transfer(reps: int) -> dict[str, Any]:
    samples = tree(16384)
    times: dict[str, list[float]] = {"json": [], "packed": []}
    sizes: dict[str, int] = {}
    for _ in range(reps):
        t0 = time.perf_counter()
        data = json_encode(samples)
        json_decode(data)
        times["json"].append(time.perf_counter() - t0)
        sizes["json"] = len(data)
        t0 = time.perf_counter()
        data = encode_microbatch(samples)
        decode_microbatch(data)
        times["packed"].append(time.perf_counter() - t0)
        sizes["packed"] = len(data)
    json_s, packed_s = statistics.median(times["json"]), statistics.median(times["packed"])
    return {
        "microbatch_flat_tokens": sum(len(s.token_ids) for s in samples),
        "microbatch_json_s": round(json_s, 5),
        "microbatch_packed_s": round(packed_s, 5),
        "microbatch_json_bytes": sizes["json"],
        "microbatch_packed_bytes": sizes["packed"],
        "microbatch_transfer_speedup_vs_json": round(json_s / packed_s, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.trainer_scale", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="tree sizes in tokens")
    parser.add_argument(
        "--reference-max-tokens", type=int, default=65536, help="largest tree compared with the unpacked run"
    )
    parser.add_argument("--reps", type=int, default=5, help="repetitions of the transfer measurement")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child process: one size
    parser.add_argument("--train", action="store_true", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.one:
        figures = one_size(ns.one, reference=ns.one <= ns.reference_max_tokens, train=ns.train)
        print(json.dumps(figures))
        return 0
    per_size: dict[str, Any] = {}
    for size in ns.sizes:
        cmd = [
            sys.executable,
            "-m",
            "bench.trainer_scale",
            "--one",
            str(size),
            "--reference-max-tokens",
            str(ns.reference_max_tokens),
        ]
        if size == max(ns.sizes):
            cmd.append("--train")
        done = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=3600)
        per_size[f"{size // 1024}k"] = json.loads(done.stdout.strip().splitlines()[-1])
    result: dict[str, Any] = {"sizes": per_size}
    diffs = [f["max_rel_grad_diff"] for f in per_size.values() if "max_rel_grad_diff" in f]
    if diffs:
        result["max_rel_grad_diff"] = max(diffs)
    if "8k" in per_size and "32k" in per_size:
        result["memory_ratio_32k_over_8k"] = round(
            per_size["32k"]["peak_mib"] / per_size["8k"]["peak_mib"], 3
        )
    largest = per_size[f"{max(ns.sizes) // 1024}k"]
    result["largest_tree_trained"] = largest.get("trained_version") == 1
    result.update(transfer(ns.reps))
    if ns.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:40s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
