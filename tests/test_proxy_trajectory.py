"""The proxy's LlmCallRecorded events as the trajectory service consumes them: every call's exact
prompt (rebuilt from its delta) and output, in one execution tree."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator

import grpc
import openai
import pytest
import pytest_asyncio
from proxy_support import Rig, start_rig, write_tokenizer

from gyre.settings import KernelSettings
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from tests.grpc_wait import once_found

pytestmark = pytest.mark.asyncio(loop_scope="session")
TOOL_CALL = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rig(kernel: KernelSettings, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    rig = await start_rig(kernel, write_tokenizer(tmp_path_factory.mktemp("tok")), num_engines=1)
    yield rig
    await rig.close()


async def test_the_trajectory_service_rebuilds_each_calls_exact_prompt(
    rig: Rig, kernel: KernelSettings
) -> None:
    from services.trajectory.config import TrajectorySettings
    from services.trajectory.main import build

    host = await build(TrajectorySettings(port=0), kernel)
    await host.start()
    channel = grpc.aio.insecure_channel(host.address)
    try:
        token, execution_id = await rig.register_execution()
        client = openai.AsyncOpenAI(base_url=f"{rig.http_url}/v1", api_key=token, max_retries=0)
        rig.scripter.replies = [TOOL_CALL, "Done."]
        tool = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
        messages: list[dict[str, object]] = [{"role": "user", "content": "list files"}]
        first = await client.chat.completions.create(model="m", messages=messages, tools=[tool])  # type: ignore[arg-type, list-item]
        call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "a.py"},
        ]
        await client.chat.completions.create(model="m", messages=messages, tools=[tool])  # type: ignore[arg-type, list-item]
        records = await rig.records(execution_id, at_least=2)
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(channel)
        engine_prompts = rig.engines[0][1].prompts
        for record in records:
            request = trajectory_pb2.GetCallRequest(call_id=record.call_id)
            got = await once_found(functools.partial(stub.GetCall, request), what=f"call {record.call_id}")
            assert list(got.call.full_prompt.prompt_ids) in engine_prompts
            assert list(got.call.output_ids) == list(record.output_ids)
        assert records[1].HasField("prompt_delta")
    finally:
        await channel.close(None)
        await host.stop(grace_s=1)
