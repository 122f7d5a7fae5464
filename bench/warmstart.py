"""`python -m bench.warmstart --json`: what the warm start costs and what it gives on held-out tasks.

Builds (or reuses from `<state>/warmstart/`) the warm-started model, generates a task set of the
three families with another seed than the warm start's, and has the built-in agent, driven
in-process by each model (greedy), attempt every held-out instance; the workspaces are graded by
the evaluator in its sandbox. "Before" is what `gyre model init` writes (random weights), the
policy a run would otherwise start from. Figures: `warm_start_s` (the build, as recorded when it
ran, and whether this run built it), `valid_tool_call_fraction_before/_after` (calls whose output
is a well-formed call of an offered tool with its required arguments, over all calls; the
reference solutions themselves answer about 3 of 4 calls with a tool call and end with a final
message), `solve_rate_before/_after` (full score) and `mean_score_before/_after` (partial credit).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from gyre.settings import KernelSettings
from gyre_app.warmstart.build import WarmStartConfig, cached_warm_start
from gyre_app.warmstart.rollout import LocalPolicy, make_grader, solve
from services.engine.model_init import init_model
from services.evaluator.generate.families import GENERATORS, plan
from services.evaluator.generate.writer import load_split, write_taskset
from services.trainer.policy import load_model


def evaluate(model_dir: Path, tasks: Path, names: list[str], *, max_turns: int) -> dict[str, Any]:
    policy = LocalPolicy(model=load_model(model_dir), tokenizer=AutoTokenizer.from_pretrained(model_dir))
    grader = make_grader()
    scores = [solve(policy, tasks / n, grader=grader, max_turns=max_turns).score for n in names]
    return {
        "valid_tool_call_fraction": policy.num_valid_tool_calls / max(1, policy.num_calls),
        "solve_rate": sum(s >= 0.999 for s in scores) / len(scores),
        "mean_score": sum(scores) / len(scores),
        "num_calls": policy.num_calls,
        "scores": {n: round(s, 3) for n, s in zip(names, scores, strict=True)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seed", type=int, default=0, help="warm-start seed")
    parser.add_argument("--tasks-seed", type=int, default=1, help="seed of the evaluated task set")
    parser.add_argument("--count", type=int, default=16, help="instances per family (a quarter held out)")
    parser.add_argument("--max-turns", type=int, default=8)
    ns = parser.parse_args()
    torch.set_num_threads(1)  # see TrainConfig.threads
    started = time.perf_counter()
    folder, built = cached_warm_start(
        KernelSettings().state_dir, WarmStartConfig(seed=ns.seed), say=lambda m: print(m, flush=True)
    )
    manifest = json.loads((folder / "warmstart.json").read_text())
    with tempfile.TemporaryDirectory(prefix="gyre-bench-warmstart-") as tmp:
        tasks = Path(tmp) / "tasks"
        write_taskset(tasks, plan(list(GENERATORS), count=ns.count), seed=ns.tasks_seed)
        heldout = load_split(tasks, "heldout")
        before_dir = init_model(Path(tmp) / "random", seed=ns.seed)
        before = evaluate(before_dir, tasks, heldout, max_turns=ns.max_turns)
        after = evaluate(folder, tasks, heldout, max_turns=ns.max_turns)
    figures = {
        "warm_start_s": manifest["build_s"],
        "warm_start_built_now": built,
        "transcripts": manifest["transcripts"],
        "sft_steps": manifest["train"]["steps"],
        "sft_loss_first": round(manifest["train"]["loss_first"], 4),
        "sft_loss_last": round(manifest["train"]["loss_last"], 4),
        "heldout_instances": len(heldout),
        **{f"{k}_before": round(v, 4) for k, v in before.items() if isinstance(v, float)},
        **{f"{k}_after": round(v, 4) for k, v in after.items() if isinstance(v, float)},
        "scores_after": after["scores"],
        "bench_s": round(time.perf_counter() - started, 1),
    }
    if not ns.json:
        for k, v in figures.items():
            print(f"{k}: {v}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
