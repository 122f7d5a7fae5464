"""The runner registers each execution's token with the real proxy and revokes it at the end."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from bench.scripted_model import ScriptedModel
from gyre.bus import Bus, BusConfig
from gyre.common.v1 import ids_pb2
from gyre.devstack.scratch import scratch_kernel
from gyre.events import new_event
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.settings import KernelSettings
from services.proxy import repo as proxy_repo
from services.proxy.config import ProxySettings
from services.proxy.main import build_proxy
from services.runner.config import RunnerSettings
from services.runner.main import build_with_supervisor

REPO = Path(__file__).resolve().parent.parent
SCRIPT = {"main": [{"tool": "shell", "args": {"command": "sleep 2"}}, {"final": "done"}]}


def runner_settings(*, proxy_address: str, proxy_base_url: str) -> RunnerSettings:
    """A runner talking to the given proxy, with small sandboxes in a folder of its own."""
    return RunnerSettings(
        sandbox_root=REPO / ".gyre" / "test-sandboxes" / uuid.uuid4().hex[:8],
        proxy_address=proxy_address,
        proxy_base_url=proxy_base_url,
        memory_mb=1024,
        max_procs=64,
        disk_mb=64,
    )


def status_for(url: str, token: str) -> int:
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=b'{"model": "gyre-policy", "messages": [{"role": "user", "content": "hi"}]}',
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.asyncio(loop_scope="session")
async def test_the_token_works_at_the_proxy_while_the_execution_runs_and_not_after(
    kernel: KernelSettings, tmp_path: Path
) -> None:
    proxy = await build_proxy(ProxySettings(model_dir=tmp_path / "no-model"), kernel)
    await proxy.host.start()
    model = ScriptedModel(script=SCRIPT)  # the harness's model calls; the proxy only checks tokens
    settings = runner_settings(proxy_address=proxy.host.address, proxy_base_url=model.start())
    host, supervisor = await build_with_supervisor(settings, kernel)
    await host.start()
    channel = grpc.aio.insecure_channel(host.address)
    try:
        request = runner_pb2.StartExecutionRequest(
            request_id=f"start-{uuid.uuid4().hex[:8]}", harness="gyre-agent", prompt="Sleep.",
            timeout_s=60.0, family="terminal",
        )  # fmt: skip
        request.execution.task_id, request.execution.execution_id = str(uuid.uuid4()), str(uuid.uuid4())
        stub = runner_pb2_grpc.RunnerServiceStub(channel)
        await stub.StartExecution(request)
        for _ in range(100):  # bounded: 20 s for the agent's first model call
            if model.seen:
                break
            await asyncio.sleep(0.2)
        token = model.seen[0].token
        assert len(token) >= 32
        during = await asyncio.to_thread(status_for, proxy.http_url, token)
        assert during != 401, "the proxy does not know the execution's token"  # 503 here: no model
        assert await asyncio.to_thread(status_for, proxy.http_url, "x" * 43) == 401  # a stranger's
        for _ in range(150):  # bounded: 30 s
            get = runner_pb2.GetExecutionRequest(execution_id=request.execution.execution_id)
            ex = (await stub.GetExecution(get)).execution
            if ex.state == runner_pb2.EXECUTION_STATE_FINISHED:
                break
            await asyncio.sleep(0.2)
        # The 503 above counts as a call the proxy failed, but the harness went on and exited 0:
        # it coped, so its end stays the policy's (not MODEL_UNAVAILABLE).
        assert ex.state == runner_pb2.EXECUTION_STATE_FINISHED
        assert await asyncio.to_thread(status_for, proxy.http_url, token) == 401
        engine = sa.ext.asyncio.create_async_engine(kernel.database_url)
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    sa.select(proxy_repo.execution_tokens.c.revoked_at).where(
                        proxy_repo.execution_tokens.c.execution_id == request.execution.execution_id
                    )
                )
            ).all()
        await engine.dispose()
        assert len(rows) == 1 and rows[0].revoked_at is not None, rows
    finally:
        await channel.close()
        await host.stop()
        supervisor.host.sweep()
        supervisor.host.root.rmdir()
        await proxy.host.stop()
        model.stop()


@pytest.mark.asyncio(loop_scope="session")
async def test_the_token_carries_the_version_the_execution_was_admitted_at(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    """ExecutionScheduled.admitted_version reaches the proxy with the token, so the proxy serves the
    execution's calls only from weights of that version or newer."""
    async with scratch_kernel(*server_urls, label="admitted") as kernel:
        proxy = await build_proxy(ProxySettings(model_dir=tmp_path / "no-model"), kernel)
        await proxy.host.start()
        model = ScriptedModel(script=SCRIPT)
        settings = runner_settings(proxy_address=proxy.host.address, proxy_base_url=model.start())
        host, supervisor = await build_with_supervisor(settings, kernel)
        await host.start()
        assert kernel.nats_url and kernel.database_url
        bus = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix))
        engine = sa.ext.asyncio.create_async_engine(kernel.database_url)
        ref = ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=str(uuid.uuid4()))
        try:
            scheduled = scheduler_events.ExecutionScheduled(
                execution=ref, family="terminal", prompt="Sleep.", harness="gyre-agent", timeout_s=60,
                admitted_version=ids_pb2.PolicyVersion(steps=7),
            )  # fmt: skip
            await bus.publish(new_event(scheduled, producer="scheduler", correlation_id=ref.task_id))
            tokens = proxy_repo.execution_tokens.c
            versions: list[int] = []
            for _ in range(150):  # bounded: 30 s for the runner to launch and register
                async with engine.connect() as conn:
                    query = sa.select(tokens.min_policy_version).where(
                        tokens.execution_id == ref.execution_id
                    )
                    versions = list((await conn.execute(query)).scalars())
                if versions:
                    break
                await asyncio.sleep(0.2)
            assert versions == [7]
            await supervisor.wait_started(ref.execution_id)
        finally:
            await engine.dispose()
            await bus.close()
            await host.stop()
            supervisor.host.sweep()
            supervisor.host.root.rmdir()
            await proxy.host.stop()
            model.stop()
