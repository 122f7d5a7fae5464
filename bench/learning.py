"""`python -m bench.learning --json [--quick]`: the learning run's gain against a control arm, with intervals.

Per seed, two arms on the live stack (`gyre_app.learn_run.run_arm`), one after the other, the
same in everything but the learning rate: the trained arm at `LearnConfig.learning_rate`, the
control at 0 (the frozen warm start): the same warm start, task set, task order (`order_seed`
= the seed), cells, mode, group size and agent settings. Each arm's weights at v0, the middle
and the last version are kept and scored in-process on the probe set (the training pool) and the
held-out split, every instance sampled `samples` times at the training temperature with sample
seeds derived from the seed, so both arms' versions are scored on the same random numbers.
Scores are cached by the weights' SHA-256: the control arm's versions, byte-identical to v0
(checked and reported), are scored once.

Figures (the last line): `gain_vs_control` = probe-set reward of the trained arm at the last
version minus the control's at the same version, a paired difference per (seed, instance),
with its bootstrap 90 % interval over those pairs (`_ci_low`, `_ci_high`);
`heldout_gain_vs_control` the same on the held-out split; `zero_advantage_group_share` (groups
of the trained arm whose rewards were all equal), `policy_timeouts` (executions of the trained
arm that ran out of their turn budget), `wall_s`, and per seed and arm the probe and held-out
means at each version with intervals, the training reward, the stack's start and training time.
`--quick`: one seed. Machine load varies the time, not the figures' protocol.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from gyre.settings import KernelSettings
from gyre_app.learn_probe import ProbeProtocol, score, weights_digest
from gyre_app.learn_progress import groups
from gyre_app.learn_run import ArmRun, LearnConfig, TaskSet, prepare_tasks, run_arm, warm_start
from gyre_app.learn_stats import (
    bootstrap_mean,
    instance_means,
    paired_differences,
    pooled,
    zero_advantage_share,
)

Scores = dict[str, list[float]]


def score_arm(
    arm: ArmRun, tokenizer: Path, tasks: TaskSet, protocol: ProbeProtocol, cache: Path
) -> dict[int, dict[str, Scores]]:
    """Version -> {"probe", "heldout"} -> instance -> rewards."""
    out = {}
    for version, folder in sorted(arm.kept.items()):
        out[version] = {
            "probe": score(
                folder, tokenizer, tasks.folder, tasks.train, protocol, cache_dir=cache, say=print
            ),
            "heldout": score(
                folder, tokenizer, tasks.folder, tasks.heldout, protocol, cache_dir=cache, say=print
            ),
        }
    return out


def arm_figures(arm: ArmRun, scored: dict[int, dict[str, Scores]], seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {"learning_rate": arm.learning_rate}
    for version, sets in scored.items():
        for name, samples in sets.items():
            out |= bootstrap_mean(list(instance_means(samples).values()), seed=seed).as_dict(
                f"{name}_v{version}"
            )
    rewards = arm.progress.rewards
    out |= {
        "train_reward_mean": round(sum(rewards) / len(rewards), 4) if rewards else None,
        "zero_advantage_group_share": round(zero_advantage_share(groups(arm.progress)), 4),
        "policy_timeouts": sum(arm.progress.out_of_turns.values()),
        "deadline_timeouts": arm.progress.deadline_cuts,
        "executions": arm.progress.counts["started"],
        "stack_up_s": round(arm.stack_up_s, 1),
        "train_s": round(arm.train_s, 1),
        "weights_sha256": {v: weights_digest(f)[:16] for v, f in sorted(arm.kept.items())},
    }
    return out


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="one seed")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None, help="trainer steps (default LearnConfig's)")
    parser.add_argument("--learning-rate", type=float, default=None)
    parser.add_argument("--groups-per-step", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument(
        "--samples", type=int, default=4, help="samples per probe / held-out instance and version"
    )
    parser.add_argument("--train-pool", type=int, default=None, help="training instances (the probe set)")
    parser.add_argument("--heldout", type=int, default=None, help="held-out instances (32 for the targets)")
    parser.add_argument("--state-dir", type=Path, default=None, help="default: a fresh temporary folder")
    ns = parser.parse_args()
    seeds = 1 if ns.quick else ns.seeds
    if seeds < 1 or ns.samples < 1:
        parser.error("--seeds and --samples must be >= 1")
    base = LearnConfig()
    config = dataclasses.replace(
        base,
        steps=ns.steps or base.steps,
        learning_rate=base.learning_rate if ns.learning_rate is None else ns.learning_rate,
        groups_per_step=ns.groups_per_step or base.groups_per_step,
        group_size=ns.group_size or base.group_size,
        train_pool=ns.train_pool or base.train_pool,
        heldout=ns.heldout or base.heldout,
    )
    if config.learning_rate <= 0:
        parser.error("--learning-rate: the trained arm needs a learning rate > 0 (the control is at 0)")
    started = time.monotonic()
    loads = [load_avg()]
    # The warm start is cached in the user's state folder (GYRE_STATE_DIR); the runs go elsewhere.
    home = KernelSettings()
    state = ns.state_dir or Path(tempfile.mkdtemp(prefix="gyre-bench-learning-"))
    state.mkdir(parents=True, exist_ok=True)
    kernel = home.model_copy(update={"state_dir": state})
    model = warm_start(home, config)
    tasks = prepare_tasks(state / "tasks", config)
    cache = state / "scores"
    per_seed: list[dict[str, Any]] = []
    trained_last: list[dict[str, Scores]] = []
    control_last: list[dict[str, Scores]] = []
    trained_groups: list[list[float]] = []
    policy_timeouts = 0
    unchanged = True
    for seed in range(seeds):
        protocol = dataclasses.replace(
            config.probe, seed=seed, samples=ns.samples, temperature=config.temperature
        )
        arms: dict[str, tuple[ArmRun, dict[int, dict[str, Scores]]]] = {}
        for name, lr in (("trained", config.learning_rate), ("control", 0.0)):
            arm_config = dataclasses.replace(config, learning_rate=lr, order_seed=seed)
            arm, _ = run_arm(
                kernel,
                arm_config,
                model=model,
                tasks=tasks,
                keep_dir=state / f"weights-{seed}-{name}",
                keep=(0, config.middle, config.steps),
            )
            loads.append(load_avg())
            arms[name] = (arm, score_arm(arm, model, tasks, protocol, cache))
            loads.append(load_avg())
        (trained, t_scores), (control, c_scores) = arms["trained"], arms["control"]
        digests = {weights_digest(f) for f in control.kept.values()}
        unchanged &= len(digests) == 1
        trained_last.append(t_scores[config.steps])
        control_last.append(c_scores[config.steps])
        trained_groups += groups(trained.progress)
        policy_timeouts += sum(trained.progress.out_of_turns.values())
        per_seed.append(
            {
                "seed": seed,
                "trained": arm_figures(trained, t_scores, seed),
                "control": arm_figures(control, c_scores, seed),
                **bootstrap_mean(
                    paired_differences(t_scores[config.steps]["probe"], c_scores[config.steps]["probe"]),
                    seed=seed,
                ).as_dict("gain_vs_control"),
                **bootstrap_mean(
                    paired_differences(t_scores[config.steps]["heldout"], c_scores[config.steps]["heldout"]),
                    seed=seed,
                ).as_dict("heldout_gain_vs_control"),
            }
        )
    figures: dict[str, Any] = {}
    for key, name in (("gain_vs_control", "probe"), ("heldout_gain_vs_control", "heldout")):
        diffs = paired_differences(
            pooled(*(r[name] for r in trained_last)), pooled(*(r[name] for r in control_last))
        )
        figures |= bootstrap_mean(diffs, seed=0).as_dict(key)
    figures |= {
        "zero_advantage_group_share": round(zero_advantage_share(trained_groups), 4),
        "policy_timeouts": policy_timeouts,
        "control_weights_unchanged": unchanged,
        "wall_s": round(time.monotonic() - started, 1),
        "seeds": seeds,
        "steps": config.steps,
        "groups_per_step": config.groups_per_step,
        "group_size": config.group_size,
        "learning_rate": config.learning_rate,
        "temperature": config.temperature,
        "max_turns": config.max_turns,
        "train_pool": len(tasks.train),
        "heldout_instances": len(tasks.heldout),
        "samples_per_instance": ns.samples,
        "load_avg": loads,
        "per_seed": per_seed,
    }
    if not ns.json:
        print(json.dumps(figures, indent=1))
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
