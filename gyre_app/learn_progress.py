"""What a learning run's bus shows: executions, rewards per group, timeouts by limit, steps (no I/O).

`Progress.see` folds the run's events (its own executions only, replacements counted for their
original's task) into counts the live table shows and the figures the run reports: every
group's assessable rewards (a group whose rewards are all equal teaches GRPO nothing), the
policy's own timeouts (out of turns) per task, and where each published version's weights are.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

from rich.table import Table

from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import DecodedEvent
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.trainer.v1 import events_pb2 as trainer_events


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
    task_rewards: dict[int, list[float]] = field(default_factory=dict)
    """Task index -> its group's assessable rewards (an infrastructure failure is no reward)."""
    published: dict[int, str] = field(default_factory=dict)
    """Policy version -> the folder its weights were published to (`WeightsPublished`)."""

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
                    task = self.executions[p.grade.execution_id]
                    self.task_rewards.setdefault(task, []).append(p.grade.score)
                self.partial += int(p.grade.partial)
            case scheduler_events.ExecutionReplacementDecided() if not p.cancelled:
                self.counts["infra failed"] += 1
                if p.HasField("replacement"):
                    self.counts["replaced"] += 1
                    self.executions[p.replacement.execution_id] = self.executions[p.execution.execution_id]
            case trainer_events.StepCompleted():
                self.step = max(self.step, int(p.version.steps))
                self.staleness.append(p.staleness_mean_steps)
            case trainer_events.WeightsPublished():
                self.published[int(p.version.steps)] = urlparse(p.source_uri).path or p.source_uri

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


def groups(progress: Progress) -> list[list[float]]:
    """Every submitted task's group rewards, in submission order (a group with no reward yet: [])."""
    return [progress.task_rewards.get(i, []) for i in range(len(progress.submitted))]
