"""A forged infrastructure failure is trained on as the policy's 0 (issue 27's "done when").

Real NATS and Postgres; the real runner (sandboxes), proxy, scheduler, evaluator, trajectory
service and trainer (a tiny torch model). Behind the proxy, a scripted engine (the GPU is the
boundary faked) answers the first harness that calls with a shell command that tells the host,
through every stderr it can reach, that the sandbox's set-up failed and then kills its agent;
the other member solves the task. The forger must not leave its group's baseline: it is graded
(0), not replaced, and its reward is in the batch the trainer's step trained on, which the test
re-derives from the trajectory service and checks against the trainer's own checksum.
"""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from proxy_support import start_rig
from test_infra_retry_runner import FORGE, retry_stack, sandbox_root, submit
from trainer_stack import eventually, start_trainer

from gyre.devstack.scratch import scratch_kernel
from gyre.runner.v1 import runner_pb2
from gyre.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from services.engine.model_init import init_model
from services.runner.config import RunnerSettings
from services.trainer.batch_digest import batch_sha256
from services.trainer.samples import Sample, StalenessAction, admit
from services.trainer.source import samples_from_response

pytestmark = pytest.mark.asyncio(loop_scope="session")


def tool_call(command: str) -> str:
    return "<tool_call>" + json.dumps({"name": "shell", "arguments": {"command": command}}) + "</tool_call>"


SOLVE = "echo 12 > total.txt; printf 'ann\\nbob\\n' > names.txt"
"""csvsum's right answer: both verdicts pass."""


async def test_a_member_that_forges_a_setup_failure_is_trained_on_with_its_zero(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    async with scratch_kernel(*server_urls, label="forged-trained") as kernel:
        # One tiny model for the proxy's tokenizer and the trainer's weights: the same vocabulary.
        model = init_model(tmp_path / "model", hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)
        rig = await start_rig(kernel, model, num_engines=1)
        # The first call of either member forges; the next first call solves; then "Done.".
        rig.scripter.replies = [tool_call(FORGE), tool_call(SOLVE)]
        settings = RunnerSettings(
            sandbox_root=sandbox_root(), proxy_address=rig.proxy.host.address, proxy_base_url=rig.http_url
        )
        try:
            async with retry_stack(kernel, tmp_path, settings) as stack:
                trainer = await start_trainer(
                    kernel, stack.trajectory_address, tmp_path / "trainer", model_dir=model
                )
                channel = grpc.aio.insecure_channel(trainer.address)
                try:
                    await stack.runner.start()
                    task = await submit(stack, request_id="forged-trained-1", group_size=2)
                    step = await first_step(trainer_pb2_grpc.TrainerServiceStub(channel))
                    group = await stack.group(task.task_id)
                    ran = {m.execution_id: await stack.ran(m.execution_id) for m in group.executions}
                    fetched: tuple[Sample, ...] = ()
                    async for response in stack.trajectory.StreamSamples(step.samples_request):
                        fetched += samples_from_response(response, index=len(fetched))
                finally:
                    await channel.close()
                    await trainer.stop()
        finally:
            await rig.close()
    forgers = [
        e for e, r in ran.items() if r.failure.kind == runner_pb2.EXECUTION_FAILURE_KIND_HARNESS_CRASHED
    ]
    solvers = [e for e, r in ran.items() if r.state == runner_pb2.EXECUTION_STATE_FINISHED]
    assert len(forgers) == 1 and len(solvers) == 1, {e: (r.state, r.failure) for e, r in ran.items()}
    [forger], [solver] = forgers, solvers
    # Scored and kept: the group is the two submitted members, none replaced, both assessable.
    assert [m.execution_id for m in group.executions] == [e.execution_id for e in task.executions]
    assert all(m.assessable and m.has_reward for m in group.executions), group
    assert list(step.task_ids) == [task.task_id]
    trained = admit(
        fetched,
        trainer_version=step.staleness.trainer_version.steps,
        max_staleness_steps=step.staleness.max_staleness_steps,
        action=StalenessAction.DROP,
    ).kept
    assert batch_sha256(trained) == step.batch_sha256  # exactly the batch the step trained on
    rewards = {s.execution_id: (s.reward, s.advantage) for s in trained}
    assert rewards[forger][0] == 0.0 and rewards[forger][1] < 0  # its 0 pulls the baseline down
    assert rewards[solver][0] == 1.0 and rewards[solver][1] > 0


async def first_step(trainer: trainer_pb2_grpc.TrainerServiceStub) -> trainer_pb2.Step:
    request = trainer_pb2.GetStepRequest()
    request.version.steps = 1
    found: list[trainer_pb2.Step] = []

    async def trained() -> bool:
        try:
            found.append((await trainer.GetStep(request)).step)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            return False
        return True

    await eventually(trained, timeout_s=240, what="the trainer's first step")
    return found[-1]
