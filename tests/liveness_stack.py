"""The stack of the liveness tests: `test_infra_retry`'s (real scheduler with its driver,
evaluator, trajectory service and trainer on real NATS and Postgres), with trainer settings of
the test's choosing (taking the steps the scheduler assigns, as the stack runs it), in async
mode, and the runner's and proxy's events for one execution of any length."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import test_infra_retry as infra
from scheduler_rig import driver_rig
from trainer_stack import start_trainer

from gyre.common.v1 import ids_pb2
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.proxy.v1 import proxy_pb2
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.runtime import ServiceHost
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.trajectory.v1 import trajectory_pb2_grpc
from services.evaluator.config import EvaluatorSettings
from services.evaluator.main import build as build_evaluator
from services.evaluator.taskset import BUNDLED
from services.trajectory.config import TrajectorySettings
from services.trajectory.main import build as build_trajectory


@asynccontextmanager
async def stack(
    server_urls: tuple[str, str],
    tmp_path: Path,
    scheduler_settings: dict[str, Any] | None = None,
    **trainer_settings: Any,
) -> AsyncIterator[infra.Stack]:
    async with driver_rig(server_urls, tmp_path, cell_lost_after_s=120, **(scheduler_settings or {})) as rig:
        hosts: list[ServiceHost] = [
            await build_trajectory(TrajectorySettings(port=0), rig.kernel),
            await build_evaluator(EvaluatorSettings(sandbox_root=tmp_path / "grading"), rig.kernel),
        ]
        for host in hosts:
            await host.start()
        trainer = await start_trainer(
            rig.kernel, hosts[0].address, tmp_path / "trainer", steps_from_scheduler=True, **trainer_settings
        )
        # A fixed split: the rig's satellite has no agent, so a switch would lose it and nothing
        # would be admitted after the first step.
        await rig.stub.SetMode(pb.SetModeRequest(request_id="liveness-async", mode=pb.SCHEDULING_MODE_ASYNC))
        channel = grpc.aio.insecure_channel(hosts[0].address)
        try:
            yield infra.Stack(
                rig=rig, trajectory=trajectory_pb2_grpc.TrajectoryServiceStub(channel), tmp=tmp_path
            )
        finally:
            await channel.close()
            await trainer.stop()
            for host in reversed(hosts):
                await host.stop()


async def run_one(
    s: infra.Stack,
    ref: ids_pb2.ExecutionRef,
    *,
    prompt_tokens: int = 3,
    cancel_reason: str = "",
    calls_recorded: int = 1,
) -> proxy_pb2.CallRecord:
    """One execution making one model call with a prompt of `prompt_tokens` (and 3 generated
    tokens), ending finished with a right answer, or cancelled through the runner (`cancel_reason`).
    `calls_recorded` is the proxy's count in the end event: more than 1 and its group waits for
    calls not published (`publish_call` them); the call made is returned."""
    work = s.tmp / f"ws-{ref.execution_id}"
    shutil.copytree(BUNDLED / "csvsum" / "workspace", work)
    (work / "total.txt").write_text("12\n")
    call = proxy_pb2.CallRecord(
        execution_id=ref.execution_id,
        call_id=str(uuid.uuid4()),
        agent_role=proxy_pb2.AGENT_ROLE_MAIN,
        agent_id="main",
        output_ids=[20, 30, 40],
        output_logprobs=[-1.0, -1.5, -2.0],
        engine_id="cell-1",
    )
    call.full_prompt.prompt_ids.extend(1 + i % 50 for i in range(prompt_tokens))
    await s.rig.publish(runner_events.ExecutionStarted(execution=ref, harness="gyre-agent"), "runner")
    await s.rig.publish(proxy_events.LlmCallRecorded(call=call), "proxy")
    common: dict[str, Any] = {
        "execution": ref,
        "workspace_uri": work.as_uri(),
        "family": "terminal",
        "task": "csvsum",
        "num_calls_recorded": calls_recorded,
    }
    if cancel_reason:
        await s.rig.publish(runner_events.ExecutionCancelled(**common, reason=cancel_reason), "runner")
    else:
        await s.rig.publish(runner_events.ExecutionFinished(**common, duration_s=2.0), "runner")
    return call


async def publish_call(s: infra.Stack, call: proxy_pb2.CallRecord) -> None:
    """Another call of the same execution (a new call id), as the proxy records it."""
    again = proxy_pb2.CallRecord()
    again.CopyFrom(call)
    again.call_id = str(uuid.uuid4())
    await s.rig.publish(proxy_events.LlmCallRecorded(call=again), "proxy")
