"""One arm of a learning run: the warm start trained on the live stack at one learning rate (shell).

`gyre demo --learn` runs one arm; `bench.learning` runs two per seed, the trained arm and its
control (learning rate 0: the frozen warm start), with everything else the same: the warm start,
the task set, the task order, the cells, the mode, the agent's settings. Each arm starts a stack
of its own in `run_dir` (embedded NATS and PostgreSQL, removed first, so it starts at policy v0),
keeps `config.groups_per_step` groups a step in flight, and copies the weights of the versions
the caller asks to keep (v0, the middle, the last) out of the trainer's folder, which prunes
old versions, before the stack goes down.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse

from rich.console import Console
from rich.live import Live

from gyre.bus import Bus, BusConfig
from gyre.errors import GyreError
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2
from gyre.settings import KernelSettings
from gyre_app.client import GyreClient, ServiceAddresses
from gyre_app.demo import WATCHED, EventTap
from gyre_app.learn_probe import ProbeProtocol
from gyre_app.learn_progress import Progress
from gyre_app.stack import StackState, down, up
from gyre_app.warmstart.build import WarmStartConfig

console = Console(highlight=False, stderr=True)
T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnConfig:
    steps: int = 12
    """Trainer steps; each trains `groups_per_step` groups."""
    groups_per_step: int = 2
    """B: one step's gradient comes from B tasks, not one (at B=1 a step's reward swung from 0.0
    to 0.83 with the task it happened to draw)."""
    group_size: int = 6
    timeout_s: int = 15
    """Each execution's wall-clock deadline (its policy's budget is `max_turns`)."""
    families: tuple[str, ...] = ("terminal",)
    """The task set trained on (the warm start imitates all three families). Terminal tasks: in
    a run on all three, every repair execution earned the untouched 0.3 and repo-gen's groups
    were uniform too (the tiny policy stopped after `__init__.py` or all wrote the same), so only
    terminal groups had the reward variance a group-relative advantage learns from."""
    count_per_family: int = 128
    """Instances generated per family; every 4th is held out (128: 96 train, 32 held out)."""
    train_pool: int = 12
    """Training instances cycled (families in turn): 12 steps of 2 groups visit each twice, so
    training tasks are revisited across epochs. They are also the probe set."""
    heldout: int = 32
    """Held-out instances scored (never trained on)."""
    tasks_seed: int = 1
    """Another seed than the warm start's (0), so no instance was in its transcripts."""
    order_seed: int = 0
    """Shuffles the training pool once per epoch; both arms of a seed share it."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    mode: str = "gyre"
    """The scheduler's mode (`gyre up --mode`): cells switch between rollout and training in `gyre`."""
    temperature: float = 0.7
    """The agent's sampling temperature: a group's executions differ where the warm start is
    unsure (finish the work or stop early); at 1.0 the tiny model garbles most held-out calls."""
    learning_rate: float = 2e-4
    """The trainer's (GYRE_TRAINER_LEARNING_RATE) for this run: at the stack's 1e-3 a few noisy
    steps undid the warm start (held-out 0.27 -> 0.10 in 15 steps)."""
    steps_ahead: int = 2
    """Tasks submitted up to `(step + steps_ahead) * groups_per_step`: the next steps' groups
    roll out while one trains, within the trainer's staleness bound, without every execution
    contending for 2 cores at once."""
    max_turns: int = 3
    """The built-in agent's turn budget (each turn a model call): a terminal reference solution's
    two tool calls and its final message, no spare. A policy that wanders (inspects twice,
    rewrites a file) spends it before declaring the work done: the agent exits with its
    out-of-turns code, the runner ends the execution as timed out, and the evaluator grades the
    workspace as it stands for partial credit. The wall-clock deadline (`timeout_s`) stays, as a
    bound on the machine, not the policy: on a loaded machine a cut there would follow the load."""
    probe: ProbeProtocol = field(default_factory=ProbeProtocol)
    """How the probe set and the held-out split are scored at fixed versions."""
    deadline_s: float = 1800.0
    """The whole training phase's bound."""
    start_timeout_s: float = 600.0
    """How long the stack may take to come up."""

    @property
    def middle(self) -> int:
        return self.steps // 2


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSet:
    folder: Path
    train: list[str]
    """The training pool, in the order a first epoch takes it."""
    heldout: list[str]


@dataclass(slots=True, kw_only=True)
class ArmRun:
    run: str
    learning_rate: float
    kept: dict[int, Path]
    """Version -> a copy of its weights (the model folder's files), outside the stack's folder."""
    progress: Progress
    train_s: float
    stack_up_s: float


def interleave(names: list[str]) -> list[str]:
    """Families taken in turn, so any three consecutive steps train one task of each.

    Example: [repair-0000, repair-0001, terminal-0000, terminal-0001]
        -> [repair-0000, terminal-0000, repair-0001, terminal-0001]
    """
    return sorted(names, key=lambda n: (n.rsplit("-", 1)[1], n))


def task_order(pool: Sequence[str], num_tasks: int, seed: int) -> list[str]:
    """`num_tasks` names from `pool`, epoch after epoch, each epoch a seeded shuffle of the pool
    (the first in the pool's own order): every instance is revisited as often as the others.

    Example: task_order(["a", "b"], 5, seed=0) -> ["a", "b", x, y, "a" or "b"] with {x, y} = {"a", "b"}
    """
    if not pool:
        raise ValueError("task_order: an empty training pool")
    rng = random.Random(seed)
    out: list[str] = []
    epoch = list(pool)
    while len(out) < num_tasks:
        out += epoch
        epoch = list(pool)
        rng.shuffle(epoch)
    return out[:num_tasks]


def prepare_tasks(folder: Path, config: LearnConfig) -> TaskSet:
    """The task set (seeded) in `folder`: the training pool and the held-out instances scored."""
    from services.evaluator.generate.families import plan
    from services.evaluator.generate.writer import load_split, write_taskset

    write_taskset(folder, plan(config.families, count=config.count_per_family), seed=config.tasks_seed)
    train, heldout = interleave(load_split(folder, "train")), interleave(load_split(folder, "heldout"))
    if len(train) < config.train_pool or len(heldout) < config.heldout:
        raise GyreError(
            f"the task set has {len(train)} train and {len(heldout)} held-out instances; the run "
            f"needs {config.train_pool} and {config.heldout} (raise count_per_family)"
        )
    return TaskSet(folder=folder, train=train[: config.train_pool], heldout=heldout[: config.heldout])


def warm_start(kernel: KernelSettings, config: LearnConfig) -> Path:
    """The cached warm-started model folder (built when missing)."""
    from gyre_app.warmstart.build import cached_warm_start

    started = time.monotonic()
    folder, built = cached_warm_start(
        kernel.state_dir.resolve(), config.warm_start, say=lambda m: console.print(f"  warm start: {m}")
    )
    console.print(
        f"warm start {'built' if built else 'reused'} ({folder}) in {time.monotonic() - started:.0f} s"
    )
    return folder


def specs(tasks: TaskSet, config: LearnConfig, run: str) -> list[scheduler_pb2.TaskSpec]:
    from services.evaluator.taskset import load_task

    order = task_order(tasks.train, config.steps * config.groups_per_step, config.order_seed)
    out = []
    for i, name in enumerate(order):
        task = load_task(str(tasks.folder / name))
        out.append(
            scheduler_pb2.TaskSpec(
                name=f"{task.name} #{i}",
                family=task.family,
                prompt=task.prompt,
                group_size=config.group_size,
                timeout_s=config.timeout_s,
                harness="gyre-agent",
                workspace_template=f"task:{task.name}",
                labels={"run": run, "split": "train"},
            )
        )
    return out


def keep_weights(source: Path, dest: Path) -> Path:
    """Copy a published version's files (the trainer prunes all but its newest few)."""
    staging = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging)
    shutil.rmtree(dest, ignore_errors=True)
    staging.rename(dest)
    return dest


async def train(
    state: StackState,
    prefix: str,
    run: str,
    config: LearnConfig,
    todo: list[scheduler_pb2.TaskSpec],
    keep: dict[int, Path],
) -> Progress:
    """Keep the next steps' tasks submitted and follow the bus until the trainer has taken
    `steps` steps; copies the weights of each version in `keep` as it is published."""
    bus = await Bus.connect(BusConfig(url=state.nats_url, prefix=prefix), name="gyre-learn")
    tap = EventTap(bus, (*WATCHED, scheduler_events.ExecutionReplacementDecided))
    await tap.start()
    started = time.monotonic()
    progress = Progress({})
    todo_keep = dict(keep)
    try:
        async with GyreClient(ServiceAddresses.resolve()) as client:

            async def submit_next() -> None:
                spec = todo[len(progress.submitted)]
                [task] = await client.submit([spec], request_id=f"learn-{run}-{len(progress.submitted)}")
                progress.executions |= dict.fromkeys(
                    (e.execution_id for e in task.executions), len(progress.submitted)
                )
                progress.submitted.append(task.task_id)

            def wanted() -> int:
                return min((progress.step + config.steps_ahead) * config.groups_per_step, len(todo))

            deadline = started + config.deadline_s
            with Live(progress.table(config.steps, started), console=console, refresh_per_second=2) as live:
                while progress.step < config.steps:
                    if time.monotonic() > deadline:
                        raise GyreError(
                            f"gave up after {config.deadline_s:.0f} s at step {progress.step} of "
                            f"{config.steps}; the service logs in the run's state folder say why"
                        )
                    for version in sorted(set(todo_keep) & set(progress.published)):
                        keep_weights(Path(progress.published[version]), todo_keep.pop(version))
                    while len(progress.submitted) < wanted():
                        await submit_next()
                    try:
                        progress.see(await asyncio.wait_for(tap.queue.get(), timeout=1.0))
                    except TimeoutError:
                        pass
                    live.update(progress.table(config.steps, started))
            for version in sorted(set(todo_keep) & set(progress.published)):
                keep_weights(Path(progress.published[version]), todo_keep.pop(version))
            if config.steps in todo_keep:  # its WeightsPublished not seen yet: the trainer says where
                uri = (await client.trainer_status()).weights_uri
                keep_weights(Path(urlparse(uri).path or uri), todo_keep.pop(config.steps))
            if todo_keep:
                raise GyreError(f"versions {sorted(todo_keep)} were never seen published")
    finally:
        await bus.close()
    return progress


def run_arm(
    kernel: KernelSettings,
    config: LearnConfig,
    *,
    model: Path,
    tasks: TaskSet,
    keep_dir: Path,
    keep: Sequence[int],
    then: Callable[[StackState, str, str], T] | None = None,
    keep_up: bool = False,
) -> tuple[ArmRun, T | None]:
    """Train `model` (a warm start's folder) on a stack of its own at `config.learning_rate`;
    `then(state, bus_prefix, run)` runs while the stack is still up (the demo's report)."""
    started = time.monotonic()
    run = uuid.uuid4().hex[:8]
    run_dir = kernel.state_dir.resolve() / "learn-run"
    learn_kernel = kernel.model_copy(update={"state_dir": run_dir, "nats_url": None, "database_url": None})
    down(learn_kernel)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    from gyre_app.warmstart.build import install

    install(model, run_dir / "model")
    keep_dir.mkdir(parents=True, exist_ok=True)
    targets = {v: keep_dir / f"v{v}" for v in keep}
    if 0 in targets:
        keep_weights(run_dir / "model", targets.pop(0))
    for var in ("RUNNER", "EVALUATOR", "SCHEDULER"):  # the scheduler refuses templates it cannot find
        os.environ[f"GYRE_{var}_TASKS_DIR"] = str(tasks.folder)
    os.environ["GYRE_STATE_DIR"] = str(run_dir)  # the client finds the stack's addresses there
    # One torch thread in every service (see TrainConfig.threads): the tiny model gains nothing from
    # a second, and on a busy machine a second thread multiplies a training step's CPU time.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["GYRE_TRAINER_LEARNING_RATE"] = repr(config.learning_rate)
    agent_env = {
        "GYRE_AGENT_TEMPERATURE": str(config.temperature),
        "GYRE_AGENT_MAX_TURNS": str(config.max_turns),
    }
    # Ten processes import torch at once: on the shared 2-core machine (load 12) that passed
    # `up`'s 180 s default before the first cell answered.
    state = up(
        learn_kernel,
        mode=config.mode,
        agent_env=agent_env,
        timeout_s=config.start_timeout_s,
        groups_per_step=config.groups_per_step,
    )
    stack_up_s = time.monotonic() - started
    console.print(
        f"stack up in {stack_up_s:.0f} s (lr {config.learning_rate:g}); training {config.steps} steps "
        f"of {config.groups_per_step} groups of {config.group_size}, deadline {config.timeout_s} s, "
        f"mode {config.mode}"
    )
    after: T | None = None
    try:
        train_started = time.monotonic()
        progress = asyncio.run(
            train(state, learn_kernel.bus_prefix, run, config, specs(tasks, config, run), targets)
        )
        train_s = time.monotonic() - train_started
        if then is not None:
            after = then(state, learn_kernel.bus_prefix, run)
    finally:
        if not keep_up:
            down(learn_kernel)
    kept = {v: keep_dir / f"v{v}" for v in keep}
    arm = ArmRun(
        run=run,
        learning_rate=config.learning_rate,
        kept=kept,
        progress=progress,
        train_s=train_s,
        stack_up_s=stack_up_s,
    )
    return arm, after
