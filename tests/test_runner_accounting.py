"""The runner's end event carries the number of calls the proxy recorded for the execution.

The built-in agent runs in a real sandbox and calls the real proxy, whose scripted engine
answers; the count on `ExecutionFinished` is what the proxy published as `LlmCallRecorded`.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc
import pytest
from proxy_support import start_rig, write_tokenizer
from test_runner_proxy import runner_settings
from trainer_stack import events_on_bus

from gyre.runner.v1 import events_pb2, runner_pb2, runner_pb2_grpc
from gyre.settings import KernelSettings
from services.runner.main import build_with_supervisor

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.asyncio(loop_scope="session")
async def test_the_end_event_counts_the_calls_the_proxy_recorded(
    kernel: KernelSettings, tmp_path: Path
) -> None:
    rig = await start_rig(kernel, write_tokenizer(tmp_path / "tokenizer"), num_engines=1)
    rig.scripter.replies = ['<tool_call>{"name": "shell", "arguments": {"command": "true"}}</tool_call>']
    settings = runner_settings(proxy_address=rig.proxy.host.address, proxy_base_url=rig.http_url)
    host, supervisor = await build_with_supervisor(settings, kernel)
    await host.start()
    channel = grpc.aio.insecure_channel(host.address)
    execution_id = str(uuid.uuid4())
    try:
        request = runner_pb2.StartExecutionRequest(
            request_id=f"start-{uuid.uuid4().hex[:8]}", harness="gyre-agent", prompt="Say done.",
            timeout_s=60.0, family="terminal",
        )  # fmt: skip
        request.execution.task_id, request.execution.execution_id = str(uuid.uuid4()), execution_id
        await runner_pb2_grpc.RunnerServiceStub(channel).StartExecution(request)
        finished: list[events_pb2.ExecutionFinished] = []
        for _ in range(300):  # bounded: 60 s (a sandbox starts slowly on a busy machine)
            events = await events_on_bus(kernel, "runner", events_pb2.ExecutionFinished)
            finished = [e for e in events if e.execution.execution_id == execution_id]
            if finished:
                break
            await asyncio.sleep(0.2)
        (event,) = finished
        records = await rig.records(execution_id, at_least=max(1, event.num_calls_recorded))
    finally:
        await channel.close()
        await host.stop()
        supervisor.host.sweep()
        supervisor.host.root.rmdir()
        await rig.close()
    assert event.HasField("num_calls_recorded")
    assert event.num_calls_recorded == len(records) >= 1  # the agent's calls (a tool call, an answer)
