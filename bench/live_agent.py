"""The scripted coding agent `bench.live` runs in place of the runner and the evaluator (shell).

An execution is a conversation of a few model calls with harness time between them, the shape
of a coding agent: it asks the model, runs a tool (tests, a build, a search) for a while, shows
the model the tool's output and asks again. The tool is not run: the harness sleeps for its
time, because on a real cluster tools run in sandboxes off the cells, so while they run the
execution holds its slot and the cell's engine has nothing to compute for it. Everything the
model sees goes through the proxy to the cells' engines (greedy, so each run makes the same
tokens), and the calls are recorded, grouped and trained as any harness's are.

A `Workload` gives, in turn, each execution's calls (output tokens of each) and the tool time
between them, and the groups a step trains. `short` (the default): a spread of lengths with a
long tail (the last shape takes about five times the first), so a step waits for its slowest
group; tool time is short beside decoding. `tools`: what real coding agents spend their wall
time on, the tools (seconds between calls), with longer outputs and two groups a step, so that
a step's training is heavy beside a call and engines are often idle while executions wait on
their tools.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import openai

from bench.cell_rig import LiveCells
from gyre.bus import Bus
from gyre.consume import ConsumerSpec
from gyre.evaluator.v1 import evaluator_pb2
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import DecodedEvent, new_event
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.scheduler.v1 import events_pb2 as scheduler_events


@dataclass(frozen=True, slots=True)
class Shape:
    outputs: tuple[int, ...]
    """Output tokens of each model call, in order."""
    tool_s: float
    """Harness time after each call but the last (the tool it asked for runs)."""


@dataclass(frozen=True, slots=True)
class Workload:
    shapes: tuple[Shape, ...]
    """Each execution's shape, in turn."""
    groups_per_step: int


WORKLOADS = {
    "short": Workload(
        shapes=(
            Shape(outputs=(32,), tool_s=0.0),
            Shape(outputs=(32, 32), tool_s=1.0),
            Shape(outputs=(32, 32, 32), tool_s=1.5),
            Shape(outputs=(48, 48, 48, 48), tool_s=2.0),
        ),
        groups_per_step=1,
    ),
    "tools": Workload(
        shapes=(
            Shape(outputs=(64, 64), tool_s=4.0),
            Shape(outputs=(64, 64, 64), tool_s=5.0),
            Shape(outputs=(64, 64, 64), tool_s=6.0),
            Shape(outputs=(96, 96, 96, 96), tool_s=6.0),
        ),
        groups_per_step=2,
    ),
}
TASK_PROMPT = (
    "The test suite fails in tests/test_parser.py::test_nested_lists with an IndexError. "
    "Find the cause in src/parser.py, fix it, and run the test suite again."
)
TOOL_OUTPUT = (
    "$ pytest -q\n....F...\nFAILED tests/test_parser.py::test_nested_lists - IndexError: list "
    "index out of range\n  File src/parser.py, line 88, in parse_items\n    item = tokens[i + 1]\n"
    "1 failed, 7 passed"
)


class ScriptedAgent:
    """Plays the runner (its harness: the workload's shapes in turn) and the evaluator for
    scheduled executions."""

    def __init__(self, live: LiveCells, bus: Bus, shapes: tuple[Shape, ...]) -> None:
        self.live = live
        self.shapes = shapes
        self.bus = bus
        self.count = 0
        self.tasks: set[asyncio.Task[None]] = set()

    def spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable="bench-live-runner",
            producer="scheduler",
            handlers={scheduler_events.ExecutionScheduled: self.on_scheduled},
        )

    async def on_scheduled(self, event: DecodedEvent) -> None:
        shape = self.shapes[self.count % len(self.shapes)]
        score = float(self.count % 2)
        self.count += 1
        task = asyncio.create_task(
            self.run(
                event.payload.execution,
                shape=shape,
                score=score,
                admitted_version=event.payload.admitted_version.steps,
            )
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def publish(self, payload: object, producer: str, correlation_id: str) -> None:
        await self.bus.publish(new_event(payload, producer=producer, correlation_id=correlation_id))  # type: ignore[arg-type]

    async def run(self, ref: Any, *, shape: Shape, score: float, admitted_version: int) -> None:
        task_id, execution_id = ref.task_id, ref.execution_id
        started = time.monotonic()
        await self.publish(runner_events.ExecutionStarted(execution=ref), "runner", task_id)
        token = await self.live.register_execution(
            execution_id=execution_id, task_id=task_id, admitted_version=admitted_version
        )
        client = openai.AsyncOpenAI(base_url=f"{self.live.http_url}/v1", api_key=token, max_retries=0)
        messages: list[dict[str, str]] = [{"role": "user", "content": TASK_PROMPT}]
        for i, length in enumerate(shape.outputs):
            if i:
                await asyncio.sleep(shape.tool_s)
                messages.append({"role": "user", "content": TOOL_OUTPUT})
            stream: Any = await client.chat.completions.create(
                model="tiny",
                messages=messages,  # type: ignore[arg-type]
                stream=True,
                temperature=0,
                max_tokens=length,
            )
            text = []
            async for chunk in stream:
                for c in chunk.choices:
                    if c.delta.content:
                        text.append(c.delta.content)
            messages.append({"role": "assistant", "content": "".join(text)})
        await client.close()
        duration = time.monotonic() - started
        await self.publish(
            runner_events.ExecutionFinished(execution=ref, duration_s=duration), "runner", task_id
        )
        grade = evaluator_pb2.Grade(execution_id=execution_id, task_id=task_id, score=score, assessable=True)
        await self.publish(evaluator_events.RewardAssigned(grade=grade), "evaluator", task_id)
