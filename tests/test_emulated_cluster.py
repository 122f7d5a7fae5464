"""An emulated cluster (EMULATION ONLY) in Gyre mode on real NATS and Postgres: 16 cells (a core with
the real trainer taking modelled steps, 15 satellites whose engines and training workers are
emulated from the H100 profile in this process) under the real scheduler, proxy and trajectory
service. A scripted agent (`bench.live_agent`) plays the runner and the evaluator. Every
execution is trained exactly once: each task's group is consumed by one step, and the steps'
samples are one per execution; satellites switched into training joined a step."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from pathlib import Path

import pytest

from bench.cell_rig import Emulated, Loop, live_cells
from bench.live_agent import ScriptedAgent, Shape
from gyre.bus import Bus, BusConfig
from gyre.consume import Consumer
from gyre.devstack.scratch import scratch_kernel
from gyre.proxy.v1 import proxy_pb2
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre_app.demo import EventTap

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
SATELLITES = 15
STEPS, GROUPS_PER_STEP, GROUP_SIZE = 3, 2, 2
# Two to three calls an execution, a modelled tool call between them; 22 ms modelled tokens at 20x.
SHAPES = (Shape(outputs=(16, 16), tool_s=0.2), Shape(outputs=(16, 16, 24), tool_s=0.3))
RUN_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from services.engine.model_init import init_model

    return init_model(tmp_path_factory.mktemp("tiny-model"))


async def test_an_emulated_cluster_in_gyre_mode_trains_every_execution_exactly_once(
    server_urls: tuple[str, str], tiny_model: Path, tmp_path: Path
) -> None:
    loop = Loop(mode="gyre", groups_per_step=GROUPS_PER_STEP, max_staleness=1)
    emulated = Emulated(
        profile=REPO / "bench" / "profiles" / "h100-emulated.yaml", time_scale=20.0, reply_tokens=24
    )
    async with scratch_kernel(*server_urls, label="emulated") as kernel:
        async with live_cells(
            kernel, tiny_model, tmp_path, satellites=SATELLITES, slots=4, loop=loop, emulated=emulated
        ) as live:
            assert kernel.nats_url is not None
            bus = await Bus.connect(
                BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix), name="test-emulated"
            )
            tap = EventTap(bus, (trainer_events.StepCompleted, scheduler_events.CellRoleChanged))
            await tap.start()
            agent = ScriptedAgent(live, bus, SHAPES)
            stop = asyncio.Event()
            consuming = asyncio.create_task(Consumer(bus, agent.spec()).run(stop))
            specs = [
                pb.TaskSpec(
                    name=f"t{i}",
                    family="terminal",
                    prompt="p",
                    group_size=GROUP_SIZE,
                    timeout_s=600,
                    harness="scripted",
                )
                for i in range(STEPS * GROUPS_PER_STEP)
            ]
            submitted = await live.scheduler.SubmitTasks(
                pb.SubmitTasksRequest(request_id=f"emulated-{uuid.uuid4().hex[:8]}", tasks=specs)
            )
            steps: list[trainer_events.StepCompleted] = []
            switches: list[pb.CellSwitch] = []
            try:
                async with asyncio.timeout(RUN_TIMEOUT_S):
                    while len(steps) < STEPS:
                        event = await tap.queue.get()
                        if isinstance(event.payload, trainer_events.StepCompleted):
                            steps.append(event.payload)
                        else:
                            switches.append(event.payload.switch)
                routing = await live.proxy.GetRouting(proxy_pb2.GetRoutingRequest())
            finally:
                stop.set()
                await consuming
                await bus.close()

    trained = Counter(task_id for step in steps for task_id in step.task_ids)
    assert sorted(trained) == sorted(t.task_id for t in submitted.tasks)
    assert set(trained.values()) == {1}, "a task's group was trained twice"
    # One trajectory per execution (each call extends the last): samples = executions.
    assert sum(step.num_samples for step in steps) == STEPS * GROUPS_PER_STEP * GROUP_SIZE
    assert [step.version.steps for step in steps] == list(range(1, STEPS + 1))
    assert {r.cell_id for r in routing.routes} == {f"cell-{i}" for i in range(1, SATELLITES + 1)}
    failed = [sw.error for sw in switches if not sw.ok]
    assert failed == []
    assert any(sw.to_role == pb.CELL_ROLE_TRAINING for sw in switches)
