"""`gyre demo` (`make demo`): the whole loop of DESIGN section 3 on the local stack, narrated (shell).

Starts the stack (embedded NATS and PostgreSQL unless GYRE_NATS_URL / GYRE_DATABASE_URL are
set) with a core cell and two satellites in Gyre mode, and submits one task group over gRPC. Then
it watches the bus while the services do the rest: the scheduler admits the task, the runner
starts the built-in agent in its sandbox, the agent's model calls go through the proxy to a
satellite's torch engine and are recorded, the evaluator grades each workspace, the trajectory
service declares the group ready, the scheduler moves idle satellites into the step, the trainer
steps and publishes the new weights. A second task brings a satellite back to rollout with the
new weights, and its calls are served by the new version.
Finally it shows that bad input is refused naming the field, and stops what it started.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from google.protobuf import message
from nats.aio.msg import Msg

from gyre.bus import Bus, BusConfig
from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre.engine.v1 import events_pb2 as engine_events
from gyre.evaluator.v1 import evaluator_pb2
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import DecodedEvent, UndecodableEvent, parse_envelope, type_map, unpack_payload
from gyre.logs import redact
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from gyre.settings import KernelSettings
from gyre.tls import aio_channel
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre.trajectory.v1 import events_pb2 as trajectory_events
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from gyre_app.stack import DEMO_GROUPS_PER_STEP, StackState, down, up

LOOP_TIMEOUT_S = 150.0
"""The whole loop's bound; it takes 10-20 s on a 2-core machine."""
TASK = "slugfix"
"""A bundled repository-repair task: untouched, its pass-to-pass tests give partial credit."""
GROUP_SIZE = 2

WATCHED: tuple[type[message.Message], ...] = (
    scheduler_events.ExecutionScheduled,
    runner_events.ExecutionStarted,
    runner_events.ExecutionFinished,
    runner_events.ExecutionTimedOut,
    runner_events.ExecutionFailed,
    proxy_events.LlmCallRecorded,
    evaluator_events.RewardAssigned,
    trajectory_events.GroupReady,
    trainer_events.StepCompleted,
    trainer_events.WeightsPublished,
    engine_events.EngineWeightsUpdated,
)
OUTCOMES = {
    v.number: v.name.removeprefix("CHECK_OUTCOME_").lower()
    for v in evaluator_pb2.CheckOutcome.DESCRIPTOR.values
}


def say(text: str) -> None:
    print(text, flush=True)


def short(some_id: str) -> str:
    """The tail of a UUIDv7 (its head is the timestamp, alike for ids made together)."""
    return "…" + some_id[-8:]


@dataclass(slots=True, kw_only=True)
class Tally:
    """What the demo saw, for the closing summary (and the end-to-end test)."""

    calls: int = 0
    output_tokens: int = 0
    versions_seen: set[int] = field(default_factory=set)
    rewards: dict[str, float] = field(default_factory=dict)
    groups_ready: set[str] = field(default_factory=set)
    steps: list[int] = field(default_factory=list)
    engine_version: int = 0


class EventTap:
    """Every watched event on the bus, in arrival order (a plain subscription: it consumes nothing)."""

    def __init__(self, bus: Bus, watched: tuple[type[message.Message], ...] = WATCHED) -> None:
        self.bus = bus
        self.types = type_map(watched)
        self.queue: asyncio.Queue[DecodedEvent] = asyncio.Queue()

    async def start(self) -> None:
        await self.bus.nc.subscribe(f"{self.bus.prefix}.>", cb=self._on_msg)

    async def _on_msg(self, msg: Msg) -> None:
        try:
            envelope = parse_envelope(msg.data)
            if envelope.event_type not in self.types:
                return
            event = unpack_payload(envelope, await self.bus.load_payload(envelope), self.types)
        except UndecodableEvent:
            return  # dead letters and other traffic under the prefix
        if event is not None:
            self.queue.put_nowait(event)

    async def until(
        self,
        done: Callable[[DecodedEvent], bool],
        on_event: Callable[[DecodedEvent], None],
        *,
        deadline: float,
        waiting_for: str,
    ) -> None:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(  # the CLI prints it as `gyre demo: ...`, no traceback
                    f"gave up waiting for {waiting_for} (the loop's time is up); "
                    "the last stage printed above is the last one reached, the service logs say why"
                )
            try:
                event = await asyncio.wait_for(self.queue.get(), timeout=left)
            except TimeoutError:
                continue
            on_event(event)
            if done(event):
                return


def stage(service: str, what: str, text: str) -> None:
    say(f"   {service:<10} {what:<20} {text}")


def narrate(event: DecodedEvent, tally: Tally, executions: set[str]) -> None:
    """One line per stage of the loop, with its ids and figures; other clients' work is skipped."""
    p = event.payload
    ref = getattr(p, "execution", None)
    execution = str(ref.execution_id) if ref is not None else ""
    if execution and execution not in executions:
        return
    name = type(p).__name__
    match p:
        case scheduler_events.ExecutionScheduled():
            where = f"harness={p.harness} workspace={p.workspace_template}"
            stage("scheduler", name, f"execution {short(execution)} {where}")
        case runner_events.ExecutionStarted():
            stage("runner", name, f"execution {short(execution)} in its sandbox, agent -> proxy")
        case runner_events.ExecutionFinished():
            stage(
                "runner", name, f"execution {short(execution)} exit {p.exit_code} after {p.duration_s:.1f} s"
            )
        case runner_events.ExecutionTimedOut() | runner_events.ExecutionFailed():
            stage("runner", name, f"execution {short(execution)}")
        case proxy_events.LlmCallRecorded():
            call = p.call
            if call.execution_id not in executions:
                return
            version = int(call.policy_version.steps)
            tally.calls += 1
            tally.output_tokens += len(call.output_ids)
            tally.versions_seen.add(version)
            prompt = "delta" if call.HasField("prompt_delta") else "full"
            stage(
                "proxy",
                name,
                f"call {short(call.call_id)} execution {short(call.execution_id)} {call.agent_id or 'main'}: "
                f"{prompt} prompt, {len(call.output_ids)} tokens out, policy v{version} on {call.engine_id}",
            )
        case evaluator_events.RewardAssigned():
            g = p.grade
            if g.execution_id not in executions:
                return
            tally.rewards[g.execution_id] = g.score
            checks = ", ".join(
                f"{c.name} {c.score:.2f}x{c.weight:.1f} ({OUTCOMES.get(c.outcome, '?')})" for c in g.checks
            )
            breakdown = checks or f"not assessable: {g.unassessable_reason}"
            stage("evaluator", name, f"execution {short(g.execution_id)} reward {g.score:.2f} = {breakdown}")
        case trajectory_events.GroupReady():
            tally.groups_ready.add(p.task_id)
            stage("trajectory", name, f"task {short(p.task_id)}: {len(p.execution_ids)} executions graded")
            if p.unassessable_execution_ids:
                say(
                    f"   ({len(p.unassessable_execution_ids)} not assessable, an infrastructure failure:"
                    " kept out of the group's baseline and the loss, not scored 0)"
                )
            rewards = {tally.rewards.get(e) for e in p.execution_ids}
            if len(rewards) == 1:
                say(
                    "   (equal rewards: every GRPO advantage is 0, so this step's gradient is 0;"
                    " the version advances all the same)"
                )
        case trainer_events.StepCompleted():
            tally.steps.append(int(p.version.steps))
            stage(
                "trainer",
                name,
                f"v{p.version.steps}: {p.num_groups_consumed} group(s), {p.num_samples} samples, "
                f"{p.num_target_tokens} target tokens, loss {p.loss:+.4f}, grad norm {p.grad_norm:.3f}, "
                f"staleness mean {p.staleness_mean_steps:.1f} max {p.staleness_max_steps}, "
                f"{p.duration_s:.2f} s",
            )
        case trainer_events.WeightsPublished():
            size = f"{p.size_bytes / 1e6:.1f} MB"
            stage("trainer", name, f"v{p.version.steps}: {size} sha256 {p.sha256[:12]}… at {p.source_uri}")
        case engine_events.EngineWeightsUpdated():
            tally.engine_version = max(tally.engine_version, int(p.version.steps))
            stage(
                "engine",
                name,
                f"{p.engine_id}: v{p.previous_version.steps} -> v{p.version.steps} "
                f"in {p.duration_s * 1000:.0f} ms, between decode steps",
            )


def task_spec(name: str) -> scheduler_pb2.TaskSpec:
    return scheduler_pb2.TaskSpec(
        name=name,
        family="repo_repair",
        prompt="Fix slug.slugify for repeated spaces and edge punctuation; keep tests/ passing.",
        group_size=GROUP_SIZE,
        timeout_s=120,
        harness="gyre-agent",
        workspace_template=f"task:{TASK}",
        labels={"split": "demo"},
    )


async def submit(scheduler: scheduler_pb2_grpc.SchedulerServiceAsyncStub, name: str) -> scheduler_pb2.Task:
    request = scheduler_pb2.SubmitTasksRequest(
        request_id=f"demo-{uuid.uuid4().hex[:8]}", tasks=[task_spec(name)]
    )
    task = (await scheduler.SubmitTasks(request)).tasks[0]
    ids = ", ".join(short(e.execution_id) for e in task.executions)
    say(f"   client     SubmitTasks({request.request_id}) -> task {short(task.task_id)}, executions {ids}")
    return task


async def show_trees(
    trajectory: trajectory_pb2_grpc.TrajectoryServiceAsyncStub, task: scheduler_pb2.Task
) -> None:
    for e in task.executions:
        tree = (
            await trajectory.GetExecutionTree(
                trajectory_pb2.GetExecutionTreeRequest(execution_id=e.execution_id)
            )
        ).tree
        stage(
            "trajectory",
            "GetExecutionTree",
            f"{short(e.execution_id)}: {len(tree.calls)} calls, {len(tree.trajectories)} trajectories, "
            f"{tree.num_unique_tokens} unique / {tree.num_flat_tokens} flat tokens, "
            f"{tree.num_target_tokens} trained on",
        )


async def run_loop(state: StackState, prefix: str, *, timeout_s: float = LOOP_TIMEOUT_S) -> Tally:
    deadline = time.monotonic() + timeout_s
    bus = await Bus.connect(BusConfig(url=state.nats_url, prefix=prefix), name="gyre-demo")
    tap = EventTap(bus)
    await tap.start()
    tally = Tally()
    try:
        async with (
            aio_channel(state.address_of("scheduler")) as sch,
            aio_channel(state.address_of("trajectory")) as trj,
            aio_channel(state.address_of("engine-cell-1")) as eng,
        ):
            scheduler = scheduler_pb2_grpc.SchedulerServiceStub(sch)
            trajectory = trajectory_pb2_grpc.TrajectoryServiceStub(trj)
            engine = engine_pb2_grpc.EngineServiceStub(eng)
            before = (await engine.GetEngineStats(engine_pb2.GetEngineStatsRequest())).policy_version.steps
            tally.engine_version = int(before)
            say(
                f"\n1. One task ({TASK}, group of {GROUP_SIZE}, harness gyre-agent); the engines serve "
                f"policy v{before}; the trainer steps every {DEMO_GROUPS_PER_STEP} group. The scheduler "
                "admits it, and moves idle satellites into the step once its group is ready."
            )
            task = await submit(scheduler, "slugfix, first group")
            executions = {e.execution_id for e in task.executions}
            await tap.until(
                lambda ev: (
                    isinstance(ev.payload, trainer_events.WeightsPublished)
                    and ev.payload.version.steps > before
                ),
                lambda ev: narrate(ev, tally, executions),
                deadline=deadline,
                waiting_for=f"the trainer to publish policy v{before + 1}",
            )
            say("\n2. What the trajectory service built from the recorded calls:")
            await show_trees(trajectory, task)
            cells = await scheduler.GetCells(scheduler_pb2.GetCellsRequest())
            stage(
                "scheduler",
                "GetCells",
                ", ".join(
                    f"{c.cell_id} {scheduler_pb2.CellRole.Name(c.role)[10:].lower()}" for c in cells.cells
                ),
            )

            say("\n3. A second task: a satellite returns to rollout with the new weights and serves it.")
            second = await submit(scheduler, "slugfix, second group")
            executions |= {e.execution_id for e in second.executions}
            await tap.until(
                lambda ev: (
                    isinstance(ev.payload, proxy_events.LlmCallRecorded)
                    and ev.payload.call.execution_id in {e.execution_id for e in second.executions}
                    and ev.payload.call.policy_version.steps > before
                ),
                lambda ev: narrate(ev, tally, executions),
                deadline=deadline,
                waiting_for=f"a call of the second task served by policy v{before + 1}",
            )
            stats = await engine.GetEngineStats(engine_pb2.GetEngineStatsRequest())
            stage(
                "engine",
                "GetEngineStats",
                f"{stats.engine_id}: policy v{stats.policy_version.steps}, "
                f"{stats.num_output_tokens} tokens generated so far",
            )

            bad = scheduler_pb2.SubmitTasksRequest(
                request_id="demo-bad", tasks=[scheduler_pb2.TaskSpec(name="x")]
            )
            try:
                await scheduler.SubmitTasks(bad)
            except grpc.aio.AioRpcError as err:
                say(f"\n4. A task without a family -> {err.code().name}: {err.details()}")
    finally:
        await bus.close()
    return tally


def main(kernel: KernelSettings, *, keep: bool = False) -> int:
    where = (
        "embedded servers" if kernel.nats_url is None or kernel.database_url is None else "configured servers"
    )
    say(f"Starting the local stack on {where} (state in {kernel.state_dir}/) ...")
    started = time.monotonic()
    try:
        state = up(kernel)
        say(f"  NATS {redact(state.nats_url)}\n  Postgres {redact(state.database_url)}")
        say(f"  model {state.model_dir}")
        for s in state.services:
            say(f"  {s.name:<10} pid {s.pid:<7} grpc {s.address}  log {s.log_path}")
        say(f"  proxy HTTP {state.proxy_http_url}/v1 (OpenAI) and /v1/messages (Anthropic)")
        say(f"  up in {time.monotonic() - started:.1f} s")
        tally = asyncio.run(run_loop(state, kernel.bus_prefix))
        mean = sum(tally.rewards.values()) / max(1, len(tally.rewards))
        say(
            f"\nLoop closed in {time.monotonic() - started:.0f} s: {tally.calls} calls recorded "
            f"({tally.output_tokens} tokens out), "
            f"{len(tally.rewards)} rewards (mean {mean:.2f}), {len(tally.groups_ready)} group(s) ready, "
            f"steps {tally.steps}, engine now at policy v{tally.engine_version}, "
            f"calls seen at versions {sorted(tally.versions_seen)}."
        )
    finally:
        if keep:
            say("\nStack left running (`gyre down` stops it).")
        else:
            say(f"\nStopped: {', '.join(down(kernel))}")
    return 0
