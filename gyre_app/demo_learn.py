"""`gyre demo --learn`: train the warm-started tiny policy through the live stack and report (shell).

1. The warm-started model (`gyre model init --warm-start`, cached in the state folder) is
   installed as the stack's model; a task set of the three families is generated (train and
   held-out splits).
2. The held-out split is scored in-process (the built-in agent driven by the model, greedy, graded
   by the evaluator in its sandbox), so the held-out tasks never reach the trainer.
3. The stack starts on embedded servers in its own state folder (`<state>/learn-run/`, removed
   first, so every run starts at policy v0) and every training task is submitted at once, `G`
   executions each with a short deadline: the trainer takes one group per step, the engine
   follows its weights, and groups that wait are trained stale. Progress is shown live.
4. The held-out split is scored again with the trainer's last weights, `gyre report` writes the
   report, and the last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from rich.console import Console
from rich.live import Live
from rich.table import Table

from gyre.bus import Bus, BusConfig
from gyre.errors import GyreError
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import DecodedEvent
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2
from gyre.settings import KernelSettings
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre_app.client import GyreClient, ServiceAddresses
from gyre_app.demo import WATCHED, EventTap
from gyre_app.report_gather import gather
from gyre_app.report_model import Report
from gyre_app.report_render import write_report
from gyre_app.stack import LOCAL_AGENT_ENV, StackState, down, up
from gyre_app.warmstart.build import WarmStartConfig

console = Console(highlight=False, stderr=True)


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnConfig:
    steps: int = 15
    """Training tasks submitted, one group (one step) each; the train split is cycled."""
    group_size: int = 6
    timeout_s: int = 15
    """Each execution's wall-clock deadline (its policy's budget is `max_turns`)."""
    families: tuple[str, ...] = ("terminal",)
    """The task set trained on (the warm start imitates all three families). Terminal tasks: in
    a run on all three, every repair execution earned the untouched 0.3 and repo-gen's groups
    were uniform too (the tiny policy stopped after `__init__.py` or all wrote the same), so only
    terminal groups had the reward variance a group-relative advantage learns from."""
    count_per_family: int = 16
    """Instances per family; every 4th is held out."""
    tasks_seed: int = 1
    """Another seed than the warm start's (0), so no instance was in its transcripts."""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    mode: str = "gyre"
    """The scheduler's mode (`gyre up --mode`): cells switch between rollout and training in `gyre`."""
    temperature: float = 0.7
    """The agent's sampling temperature: a group's executions differ where the warm start is
    unsure (finish the work or stop early); at 1.0 the tiny model garbles most held-out calls."""
    learning_rate: float = 2e-4
    """The trainer's (GYRE_TRAINER_LEARNING_RATE) for this run: at the stack's 1e-3 a few noisy
    steps undid the warm start (held-out 0.27 -> 0.10 in 15 steps)."""
    in_flight: int = 2
    """Training tasks submitted at a time: the next goes in as a step completes, so samples stay
    within the trainer's staleness bound and executions do not all contend for 2 cores at once."""
    max_turns: int = 3
    """The built-in agent's turn budget (each turn a model call): a terminal reference solution's
    two tool calls and its final message, no spare. A policy that wanders (inspects twice,
    rewrites a file) spends it before declaring the work done: the agent exits with its
    out-of-turns code, the runner ends the execution as timed out, and the evaluator grades the
    workspace as it stands for partial credit. The wall-clock deadline (`timeout_s`) stays, as a
    bound on the machine, not the policy: on a loaded machine a cut there would follow the load."""
    deadline_s: float = 1800.0
    """The whole training phase's bound."""
    start_timeout_s: float = 600.0
    """How long the stack may take to come up."""


@dataclass(slots=True)
class Progress:
    """What the live table shows, from the bus."""

    executions: dict[str, int]
    """The run's executions (replacements included) -> the index of their task among `submitted`."""
    submitted: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("started", "finished", "timed out", "failed", "infra failed", "replaced", "rewarded"), 0
        )
    )
    rewards: list[float] = field(default_factory=list)
    partial: int = 0
    out_of_turns: dict[int, int] = field(default_factory=dict)
    """Task index -> its executions that spent the agent's turn budget (timed out by the policy)."""
    deadline_cuts: int = 0
    """Executions cut by the wall-clock deadline (timed out by the machine as much as the policy)."""
    step: int = 0
    step_rewards: list[float] = field(default_factory=list)
    staleness: list[float] = field(default_factory=list)

    def see(self, event: DecodedEvent) -> None:
        p = event.payload
        ref = getattr(p, "execution", None)
        if ref is not None and ref.execution_id not in self.executions:
            return
        match p:
            case runner_events.ExecutionStarted():
                self.counts["started"] += 1
            case runner_events.ExecutionFinished():
                self.counts["finished"] += 1
            case runner_events.ExecutionTimedOut():
                self.counts["timed out"] += 1
                if p.limit == runner_events.TIMEOUT_LIMIT_HARNESS_BUDGET:
                    task = self.executions[p.execution.execution_id]
                    self.out_of_turns[task] = self.out_of_turns.get(task, 0) + 1
                else:
                    self.deadline_cuts += 1
            case runner_events.ExecutionFailed():
                self.counts["failed"] += 1
            case evaluator_events.RewardAssigned() if p.grade.execution_id in self.executions:
                self.counts["rewarded"] += 1
                if p.grade.assessable:  # an infrastructure failure is no reward of 0
                    self.rewards.append(p.grade.score)
                self.partial += int(p.grade.partial)
            case scheduler_events.ExecutionReplacementDecided() if not p.cancelled:
                self.counts["infra failed"] += 1
                if p.HasField("replacement"):
                    self.counts["replaced"] += 1
                    self.executions[p.replacement.execution_id] = self.executions[p.execution.execution_id]
            case trainer_events.StepCompleted():
                self.step = max(self.step, int(p.version.steps))
                self.staleness.append(p.staleness_mean_steps)

    def table(self, target_steps: int, started: float) -> Table:
        t = Table(title=f"gyre demo --learn ({time.monotonic() - started:.0f} s)", title_justify="left")
        for c in ("step", "executions", "reward (last 8)", "partial credit", "staleness (last)"):
            t.add_column(c)
        n = self.counts
        recent = self.rewards[-8:]
        t.add_row(
            f"{self.step}/{target_steps}",
            ", ".join(f"{v} {k}" for k, v in n.items() if k != "rewarded"),
            f"{sum(recent) / len(recent):.2f}" if recent else "-",
            f"{self.partial} timed-out graded ({sum(self.out_of_turns.values())} out of turns)",
            f"{self.staleness[-1]:.1f}" if self.staleness else "-",
        )
        return t


def score_heldout(
    model_dir: Path, tokenizer_dir: Path, tasks: Path, names: list[str], max_turns: int
) -> float:
    """Mean held-out score of the built-in agent driven by the model in-process (greedy)."""
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(1)  # see TrainConfig.threads: a second thread only spins on a busy machine

    from gyre_app.warmstart.rollout import LocalPolicy, make_grader, solve
    from services.trainer.policy import load_model

    policy = LocalPolicy(
        model=load_model(model_dir),
        tokenizer=AutoTokenizer.from_pretrained(tokenizer_dir),
        max_tokens=int(LOCAL_AGENT_ENV["GYRE_AGENT_MAX_TOKENS"]),  # as the stack's agent replies
    )
    grader = make_grader()
    scores = [solve(policy, tasks / n, grader=grader, max_turns=max_turns).score for n in names]
    return sum(scores) / len(scores)


def prepare(kernel: KernelSettings, run_dir: Path, config: LearnConfig) -> tuple[Path, list[str], list[str]]:
    """Warm start into `run_dir/model`, task set into `run_dir/tasks`; (tasks, train, held-out)."""
    from gyre_app.warmstart.build import cached_warm_start, install
    from services.evaluator.generate.families import plan
    from services.evaluator.generate.writer import load_split, write_taskset

    started = time.monotonic()
    folder, built = cached_warm_start(
        kernel.state_dir.resolve(),
        config.warm_start,
        say=lambda m: console.print(f"  warm start: {m}"),
    )
    install(folder, run_dir / "model")
    console.print(
        f"warm start {'built' if built else 'reused'} ({folder}) in {time.monotonic() - started:.0f} s"
    )
    tasks = run_dir / "tasks"
    write_taskset(tasks, plan(config.families, count=config.count_per_family), seed=config.tasks_seed)
    return tasks, interleave(load_split(tasks, "train")), load_split(tasks, "heldout")


def interleave(names: list[str]) -> list[str]:
    """Families taken in turn, so any three consecutive steps train one task of each.

    Example: [repair-0000, repair-0001, terminal-0000, terminal-0001]
        -> [repair-0000, terminal-0000, repair-0001, terminal-0001]
    """
    return sorted(names, key=lambda n: (n.rsplit("-", 1)[1], n))


def specs(tasks: Path, names: list[str], config: LearnConfig, run: str) -> list[scheduler_pb2.TaskSpec]:
    from services.evaluator.taskset import load_task

    out = []
    for i in range(config.steps):
        task = load_task(str(tasks / names[i % len(names)]))
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


async def train(
    state: StackState, prefix: str, run: str, config: LearnConfig, todo: list[scheduler_pb2.TaskSpec]
) -> tuple[str, Progress]:
    """Keep `in_flight` training tasks submitted (the next one as each step completes) and follow
    the bus until the trainer has taken `steps` steps; returns the last weights' folder and what
    the bus showed."""
    bus = await Bus.connect(BusConfig(url=state.nats_url, prefix=prefix), name="gyre-demo-learn")
    tap = EventTap(bus, (*WATCHED, scheduler_events.ExecutionReplacementDecided))
    await tap.start()
    started = time.monotonic()
    progress = Progress({})
    try:
        async with GyreClient(ServiceAddresses.resolve()) as client:

            async def submit_next() -> None:
                spec = todo[len(progress.submitted)]
                [task] = await client.submit([spec], request_id=f"learn-{run}-{len(progress.submitted)}")
                progress.executions |= dict.fromkeys(
                    (e.execution_id for e in task.executions), len(progress.submitted)
                )
                progress.submitted.append(task.task_id)

            while len(progress.submitted) < min(config.in_flight, len(todo)):
                await submit_next()
            deadline = started + config.deadline_s
            with Live(progress.table(config.steps, started), console=console, refresh_per_second=2) as live:
                while progress.step < config.steps:
                    if time.monotonic() > deadline:
                        raise GyreError(
                            f"gave up after {config.deadline_s:.0f} s at step {progress.step} of "
                            f"{config.steps}; the service logs in the run's state folder say why"
                        )
                    try:
                        progress.see(await asyncio.wait_for(tap.queue.get(), timeout=1.0))
                    except TimeoutError:
                        pass
                    while len(progress.submitted) < min(progress.step + config.in_flight, len(todo)):
                        await submit_next()
                    live.update(progress.table(config.steps, started))
            weights_uri = (await client.trainer_status()).weights_uri
    finally:
        await bus.close()
    return urlparse(weights_uri).path or weights_uri, progress


def timeouts(progress: Progress, steps: int) -> dict[str, int]:
    """The run's timeouts by limit, and the policy's own (out of turns) in its first and last three
    tasks: a policy that learns to get to work runs out of turns less often.

    Example: out_of_turns {0: 2, 1: 1, 14: 1}, steps 15 -> turn_budget 4, first 3, last 1
    """
    by_task = progress.out_of_turns
    return {
        "timed_out_turn_budget": sum(by_task.values()),
        "timed_out_deadline": progress.deadline_cuts,
        "out_of_turns_first": sum(by_task.get(i, 0) for i in range(min(3, steps))),
        "out_of_turns_last": sum(by_task.get(i, 0) for i in range(max(steps - 3, 0), steps)),
    }


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
    run = uuid.uuid4().hex[:8]
    run_dir = kernel.state_dir.resolve() / "learn-run"
    # Its own embedded servers and state folder, emptied first: every run starts at policy v0.
    learn_kernel = kernel.model_copy(update={"state_dir": run_dir, "nats_url": None, "database_url": None})
    down(learn_kernel)
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    tasks, train_names, heldout_names = prepare(kernel, run_dir, config)
    model = run_dir / "model"
    console.print(
        f"task set {tasks}: {len(train_names)} train, {len(heldout_names)} held out; "
        "scoring held-out at v0 ..."
    )
    heldout_first = score_heldout(model, model, tasks, heldout_names, config.max_turns)
    console.print(f"held-out mean score at v0: {heldout_first:.3f}")
    os.environ["GYRE_RUNNER_TASKS_DIR"] = str(tasks)
    os.environ["GYRE_EVALUATOR_TASKS_DIR"] = str(tasks)
    os.environ["GYRE_SCHEDULER_TASKS_DIR"] = str(tasks)  # it refuses templates it cannot find
    os.environ["GYRE_STATE_DIR"] = str(run_dir)  # the client finds the stack's addresses there
    # One torch thread in every service (see TrainConfig.threads): the tiny model gains nothing from
    # a second, and on a busy machine a second thread multiplies a training step's CPU time.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["GYRE_TRAINER_LEARNING_RATE"] = str(config.learning_rate)
    agent_env = {
        "GYRE_AGENT_TEMPERATURE": str(config.temperature),
        "GYRE_AGENT_MAX_TURNS": str(config.max_turns),
    }
    # Ten processes import torch at once: on the shared 2-core machine (load 12) that passed
    # `up`'s 180 s default before the first cell answered.
    state = up(learn_kernel, mode=config.mode, agent_env=agent_env, timeout_s=config.start_timeout_s)
    console.print(
        f"stack up ({time.monotonic() - started:.0f} s so far); training {config.steps} steps, "
        f"groups of {config.group_size}, deadline {config.timeout_s} s, mode {config.mode}"
    )
    try:
        weights, progress = asyncio.run(
            train(state, learn_kernel.bus_prefix, run, config, specs(tasks, train_names, config, run))
        )
        console.print(f"scoring held-out with v{config.steps} ({weights}) ...")
        heldout_last = score_heldout(Path(weights), model, tasks, heldout_names, config.max_turns)
        out = kernel.state_dir.resolve() / "reports" / f"learn-{run}.html"
        heldout = {0: heldout_first, config.steps: heldout_last}
        report, path = asyncio.run(make_report(state, learn_kernel.bus_prefix, run, heldout, out))
    finally:
        if not keep:
            down(learn_kernel)
    summary = {
        **report.summary(),
        **timeouts(progress, config.steps),
        "report": str(path),
        "group_size": config.group_size,
        "timeout_s": config.timeout_s,
        "duration_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(summary), flush=True)
    return 0
