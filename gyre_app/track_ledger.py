"""What the tracker remembers between steps, and what it hands the sinks at each step (pure).

The shell (`track_follow`) turns each event into one `record_*` call; `complete_step` then
returns the step's row, its table of sample executions and its executions' ATIF trajectories,
and forgets the executions the step consumed, so an hour-long run's memory stays bounded by the
executions not yet trained on.

Events arrive per producer's stream; the shell reads every other stream before the trainer's, so
the rewards, ends and calls of a step's executions (all published before the trainer could train
on them) are recorded before its `StepCompleted`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gyre_app.atif import atif_trajectory
from gyre_app.track_rows import EngineSample, ExecutionFacts, StepFacts, StepRow, step_row

PROMPT_CHARS = 2000
"""A sample row's prompt is cut to this many characters (its end: the task comes last)."""
OUTPUT_CHARS = 1000


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallFacts:
    name: str
    arguments: str
    """As the model wrote them (JSON text)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFacts:
    """One recorded model call, its tokens decoded where the shell had the tokenizer."""

    call_id: str
    execution_id: str
    agent_id: str
    started_s: float
    finished_s: float
    num_prompt_tokens: int
    """Of a full prompt; 0 for a delta (its base was counted with the earlier call)."""
    num_output_tokens: int
    hit_context: bool
    decoded: bool
    """Whether the texts and tool calls below come from the tokenizer (False: none was found)."""
    prompt_text: str = ""
    """A full prompt's text; empty for a delta."""
    output_text: str = ""
    tool_calls: tuple[ToolCallFacts, ...] = ()
    num_malformed_tool_calls: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class StepOutput:
    row: StepRow
    samples: list[dict[str, Any]]
    trajectories: dict[str, dict[str, Any]]
    """ATIF trajectory of each of the step's executions, by execution id."""


@dataclass(slots=True, kw_only=True)
class RunLedger:
    samples_per_step: int = 4
    run_name: str = "gyre"
    model_name: str = ""
    executions: dict[str, ExecutionFacts] = field(default_factory=dict)
    calls: dict[str, list[CallFacts]] = field(default_factory=dict)
    weight_loads_s: list[float] = field(default_factory=list)
    cell_roles: dict[str, str] = field(default_factory=dict)
    engine_addresses: dict[str, str] = field(default_factory=dict)
    """Each satellite cell's engine `host:port`, as it registered: where the shell samples stats."""
    engine_samples: list[EngineSample] = field(default_factory=list)
    """Sampled since the previous row."""
    engine_baseline: dict[str, EngineSample] = field(default_factory=dict)
    """Each engine's last sample at the previous row (its counters' starting point for the next)."""

    def _facts(self, execution_id: str, task_id: str) -> ExecutionFacts:
        return self.executions.get(execution_id) or ExecutionFacts(execution_id=execution_id, task_id=task_id)

    def record_reward(self, *, execution_id: str, task_id: str, reward: float, assessable: bool) -> None:
        facts = self._facts(execution_id, task_id)
        self.executions[execution_id] = dataclasses.replace(facts, reward=reward, assessable=assessable)

    def record_ending(self, *, execution_id: str, task_id: str, ending: str) -> None:
        facts = self._facts(execution_id, task_id)
        self.executions[execution_id] = dataclasses.replace(facts, ending=ending)

    def record_call(self, call: CallFacts) -> None:
        self.calls.setdefault(call.execution_id, []).append(call)

    def record_weight_load(self, duration_s: float) -> None:
        self.weight_loads_s.append(duration_s)

    def record_cell_role(self, cell_id: str, role: str) -> None:
        self.cell_roles[cell_id] = role

    def record_engine_address(self, cell_id: str, address: str) -> None:
        if address:
            self.engine_addresses[cell_id] = address

    def record_engine_samples(self, samples: Sequence[EngineSample]) -> None:
        self.engine_samples.extend(samples)

    def forget_task(self, task_id: str) -> None:
        """A group the trainer set aside is never trained: its executions would never leave."""
        for execution_id in [e for e, facts in self.executions.items() if facts.task_id == task_id]:
            self.executions.pop(execution_id, None)
            self.calls.pop(execution_id, None)

    def complete_step(self, step: StepFacts) -> StepOutput:
        """The step's row, samples and trajectories; its executions are forgotten afterwards."""
        tasks = set(step.task_ids)
        mine = [self._with_calls(e) for e in self.executions.values() if e.task_id in tasks]
        calls = [c for e in mine for c in self.calls.get(e.execution_id, [])]
        parse_errors = (
            sum(c.num_malformed_tool_calls for c in calls) if all(c.decoded for c in calls) else None
        )
        row = step_row(
            step,
            mine,
            weight_sync_s=self.weight_loads_s,
            cell_roles=self.cell_roles,
            tool_call_parse_errors=parse_errors,
            engine_samples=self.engine_samples,
            engine_baseline=self.engine_baseline,
        )
        samples = [self._sample(step.step, e) for e in pick_samples(mine, self.samples_per_step)]
        trajectories = {
            e.execution_id: atif_trajectory(
                e,
                self.calls.get(e.execution_id, []),
                step=step.step,
                agent_name=self.run_name,
                model_name=self.model_name,
            )
            for e in mine
        }
        for e in mine:
            self.executions.pop(e.execution_id, None)
            self.calls.pop(e.execution_id, None)
        self.weight_loads_s = []
        self.engine_baseline |= {s.engine_id: s for s in self.engine_samples}
        self.engine_samples = []
        return StepOutput(row=row, samples=samples, trajectories=trajectories)

    def _with_calls(self, facts: ExecutionFacts) -> ExecutionFacts:
        calls = self.calls.get(facts.execution_id, [])
        if not calls:
            return facts
        context = any(c.hit_context for c in calls)
        return dataclasses.replace(
            facts,
            num_turns=len(calls),
            num_output_tokens=sum(c.num_output_tokens for c in calls),
            num_prompt_tokens=sum(c.num_prompt_tokens for c in calls),
            hit_context=context,
            ending="context" if context and facts.ending not in ("done", "infrastructure") else facts.ending,
            first_call_s=min(c.started_s for c in calls),
            last_call_s=max(c.finished_s for c in calls),
        )

    def _sample(self, step: int, facts: ExecutionFacts) -> dict[str, Any]:
        calls = sorted(self.calls.get(facts.execution_id, []), key=lambda c: c.started_s)
        prompt = next((c.prompt_text for c in calls if c.prompt_text), "")
        return {
            "step": step,
            "execution_id": facts.execution_id,
            "task_id": facts.task_id,
            "reward": facts.reward,
            "ending": facts.ending,
            "turns": facts.num_turns,
            "prompt": prompt[-PROMPT_CHARS:],
            "tool_calls": [{"name": t.name, "arguments": t.arguments} for c in calls for t in c.tool_calls],
            "last_output": calls[-1].output_text[:OUTPUT_CHARS] if calls else "",
        }


def pick_samples(executions: Sequence[ExecutionFacts], count: int) -> list[ExecutionFacts]:
    """The best and the worst rewarded executions, alternately, so the table shows both ends.

    Example: rewards a=1.0, b=0.0, c=0.5, d=0.2, count=3 -> [a, b, c]
    """
    ranked = sorted(executions, key=lambda e: (-(e.reward if e.reward is not None else -1.0), e.execution_id))
    picked: list[ExecutionFacts] = []
    low, high = len(ranked) - 1, 0
    while len(picked) < min(count, len(ranked)):
        if len(picked) % 2 == 0:
            picked.append(ranked[high])
            high += 1
        else:
            picked.append(ranked[low])
            low -= 1
    return picked
