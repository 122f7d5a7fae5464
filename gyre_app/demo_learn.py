"""`gyre demo --learn`: train the warm-started tiny policy through the live stack and report (shell).

1. The warm-started model (`gyre model init --warm-start`, cached in the state folder) and a task
   set (seeded): a training pool (the probe set) and a held-out split of at least 32 instances.
2. The probe set and the held-out split are scored at v0 in-process (the built-in agent driven by
   the model, each instance sampled `probe.samples` times at the training temperature, graded by
   the evaluator in its sandbox), so held-out tasks never reach the trainer.
3. One arm trains on a stack of its own (`learn_run.run_arm`): several groups a step, the pool
   revisited epoch after epoch. Progress is shown live.
4. Both sets are scored again at the last version; `gyre report` writes the report, and the last
   line printed is one JSON object: each figure with its bootstrap 90 % interval, the paired gain
   over v0, the share of groups with all-zero advantages and the policy's timeouts. The gain over
   v0 is not a gain over a control: `python -m bench.learning` runs the same arm at learning rate
   0 beside it, and the README quotes that.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path

from rich.console import Console

from gyre.bus import Bus, BusConfig
from gyre.settings import KernelSettings
from gyre_app.client import GyreClient, ServiceAddresses
from gyre_app.learn_probe import score
from gyre_app.learn_progress import groups, timeouts
from gyre_app.learn_run import LearnConfig, TaskSet, prepare_tasks, run_arm, warm_start
from gyre_app.learn_stats import bootstrap_mean, instance_means, paired_differences, zero_advantage_share
from gyre_app.report_gather import gather
from gyre_app.report_model import Report
from gyre_app.report_render import write_report
from gyre_app.stack import StackState

console = Console(highlight=False, stderr=True)

__all__ = ["LearnConfig", "main"]


def scores(
    model: Path, tokenizer: Path, tasks: TaskSet, config: LearnConfig, cache: Path
) -> dict[str, dict[str, list[float]]]:
    """{"probe": ..., "heldout": ...}: instance -> rewards at the weights in `model`."""
    say = lambda m: console.print(f"  {m}")  # noqa: E731
    return {
        "probe": score(model, tokenizer, tasks.folder, tasks.train, config.probe, cache_dir=cache, say=say),
        "heldout": score(
            model, tokenizer, tasks.folder, tasks.heldout, config.probe, cache_dir=cache, say=say
        ),
    }


def figures(
    first: dict[str, dict[str, list[float]]], last: dict[str, dict[str, list[float]]], seed: int
) -> dict[str, float]:
    """Each set's mean reward at v0 and at the last version with intervals, and the paired gain."""
    out: dict[str, float] = {}
    for name in ("probe", "heldout"):
        out |= bootstrap_mean(list(instance_means(first[name]).values()), seed=seed).as_dict(f"{name}_v0")
        out |= bootstrap_mean(list(instance_means(last[name]).values()), seed=seed).as_dict(f"{name}_last")
        out |= bootstrap_mean(paired_differences(last[name], first[name]), seed=seed).as_dict(
            f"{name}_gain_vs_v0"
        )
    return out


async def make_report(
    state: StackState, prefix: str, run: str, heldout: dict[int, float], out: Path
) -> tuple[Report, Path]:
    bus = await Bus.connect(BusConfig(url=state.nats_url, prefix=prefix), name="gyre-demo-report")
    try:
        async with GyreClient(ServiceAddresses.resolve()) as client:
            report = await gather(client, bus, run=run, heldout=heldout)
    finally:
        await bus.close()
    return report, write_report(report, out)


def main(kernel: KernelSettings, config: LearnConfig, *, keep: bool = False) -> int:
    started = time.monotonic()
    state_dir = kernel.state_dir.resolve()
    model = warm_start(kernel, config)
    state_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(state_dir / "learn-tasks", ignore_errors=True)  # the writer refuses to overwrite
    tasks = prepare_tasks(state_dir / "learn-tasks", config)
    cache = state_dir / "learn-scores"
    console.print(
        f"task set {tasks.folder}: a pool of {len(tasks.train)} to train on (the probe set), "
        f"{len(tasks.heldout)} held out; scoring both at v0, {config.probe.samples} samples each ..."
    )
    first = scores(model, model, tasks, config, cache)
    seed = config.probe.seed
    console.print(
        f"v0: probe {bootstrap_mean(list(instance_means(first['probe']).values()), seed=seed).mean:.3f}, "
        f"held-out {bootstrap_mean(list(instance_means(first['heldout']).values()), seed=seed).mean:.3f}"
    )
    keep_dir = state_dir / "learn-weights"

    def after_training(
        state: StackState, prefix: str, run: str
    ) -> tuple[dict[str, dict[str, list[float]]], Report, Path]:
        console.print(f"scoring the probe set and held-out with v{config.steps} ...")
        last = scores(keep_dir / f"v{config.steps}", model, tasks, config, cache)
        heldout = {
            0: sum(instance_means(first["heldout"]).values()) / len(tasks.heldout),
            config.steps: sum(instance_means(last["heldout"]).values()) / len(tasks.heldout),
        }
        out = state_dir / "reports" / f"learn-{run}.html"
        report, path = asyncio.run(make_report(state, prefix, run, heldout, out))
        return last, report, path

    arm, after = run_arm(
        kernel,
        config,
        model=model,
        tasks=tasks,
        keep_dir=keep_dir,
        keep=(0, config.steps),
        then=after_training,
        keep_up=keep,
    )
    assert after is not None
    last, report, path = after
    result = figures(first, last, seed)
    summary = {
        **report.summary(),
        **result,
        "zero_advantage_group_share": round(zero_advantage_share(groups(arm.progress)), 4),
        "policy_timeouts": sum(arm.progress.out_of_turns.values()),
        **timeouts(arm.progress, len(arm.progress.submitted)),
        "control": "not run here: python -m bench.learning runs the same arm at learning rate 0 beside it",
        "report": str(path),
        "groups_per_step": config.groups_per_step,
        "group_size": config.group_size,
        "probe_samples": config.probe.samples,
        "timeout_s": config.timeout_s,
        "duration_s": round(time.monotonic() - started, 1),
    }
    console.print(
        "probe set (training tasks) {:.3f} [{:.3f}, {:.3f}] at v0 -> {:.3f} [{:.3f}, {:.3f}] at v{}; "
        "held-out {:.3f} [{:.3f}, {:.3f}] -> {:.3f} [{:.3f}, {:.3f}] (means over instances, 90 % bootstrap "
        "intervals); no control arm here: python -m bench.learning runs one".format(
            *(result[f"probe_v0{s}"] for s in ("", "_ci_low", "_ci_high")),
            *(result[f"probe_last{s}"] for s in ("", "_ci_low", "_ci_high")),
            config.steps,
            *(result[f"heldout_v0{s}"] for s in ("", "_ci_low", "_ci_high")),
            *(result[f"heldout_last{s}"] for s in ("", "_ci_low", "_ci_high")),
        )
    )
    print(json.dumps(summary), flush=True)
    return 0
