"""A harness that retries a call cut by a proxy restart gets one answer and one record.

The proxy runs as its own process (killed with SIGKILL and started again on its ports) or
in-process (rebuilt on the same database), before scripted engines whose every generation
answers differently, so a call generated twice would show.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import pytest_asyncio
from proxy_support import Rig, Scripter, start_rig, write_tokenizer
from trainer_stack import fresh_kernel

from bench.scripted_engine import start_scripted_engine
from gyre.devstack.embedded import free_port
from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from gyre.settings import KernelSettings

pytestmark = pytest.mark.asyncio(loop_scope="session")
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "What is the answer?"}]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


def counting(scripter: Scripter) -> Scripter:
    """Every generation answers `Answer N.` with the next N."""
    count = iter(range(1, 1000))
    scripter.rule = lambda prompt: f"Answer {next(count)}."
    return scripter


async def register_token(stub: Any) -> tuple[str, str]:
    token, execution_id = "gyre-" + secrets.token_hex(24), str(uuid.uuid4())
    request = proxy_pb2.RegisterExecutionTokenRequest(request_id=f"reg-{execution_id}", token=token)
    request.execution.execution_id = execution_id
    request.execution.task_id = str(uuid.uuid4())
    request.expires_at.FromDatetime(datetime.now(UTC) + timedelta(hours=1))
    await stub.RegisterExecutionToken(request)
    return token, execution_id


async def revoke(stub: Any, execution_id: str) -> int:
    answer = await stub.RevokeExecutionToken(
        proxy_pb2.RevokeExecutionTokenRequest(request_id=f"rev-{execution_id}", execution_id=execution_id)
    )
    return int(answer.num_calls_recorded)


async def complete(url: str, token: str, **headers: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{url}/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {token}", **headers}
        ) as resp:
            assert resp.status == 200, await resp.text()
            answer: dict[str, Any] = await resp.json()
            return answer


class ProxyProcess:
    """`python -m services.proxy` on fixed ports, so a restarted one is found where the old one was."""

    def __init__(self, kernel: KernelSettings, model_dir: Path, log: Path) -> None:
        self.grpc_port, self.http_port = free_port(), free_port()
        self.env = {
            **os.environ,
            "GYRE_NATS_URL": str(kernel.nats_url),
            "GYRE_DATABASE_URL": str(kernel.database_url),
            "GYRE_BUS_PREFIX": kernel.bus_prefix,
            "GYRE_PROXY_PORT": str(self.grpc_port),
            "GYRE_PROXY_HTTP_PORT": str(self.http_port),
            "GYRE_PROXY_MODEL_DIR": str(model_dir),
            "GYRE_PROXY_MODEL_NAME": "tiny",
        }
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _spawn(self) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "services.proxy"], env=self.env, stdout=out, stderr=out
            )

    async def start(self) -> None:
        self.process = await asyncio.to_thread(self._spawn)
        async with aiohttp.ClientSession() as http:
            for _ in range(600):  # bounded: 60 s (migrations and the tokenizer load first)
                assert self.process.poll() is None, self.log.read_text()[-3000:]
                try:
                    async with http.get(f"{self.url}/health") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError(f"the proxy did not serve in time: {self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        assert self.process.wait(10) == -signal.SIGKILL

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


async def test_a_retry_with_its_key_after_a_proxy_kill_gets_the_recorded_answer(
    server_urls: tuple[str, str], model_dir: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    scripter = counting(
        Scripter(tokenizer=AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True))
    )
    engine_server, engine = await start_scripted_engine(scripter, engine_id="engine-1", cell_id="cell-1")
    async with fresh_kernel(*server_urls) as kernel:
        proxy = ProxyProcess(kernel, model_dir, tmp_path / "proxy.log")
        try:
            await proxy.start()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{proxy.grpc_port}") as channel:
                stub = proxy_pb2_grpc.ProxyServiceStub(channel)
                await stub.RegisterEngine(
                    proxy_pb2.RegisterEngineRequest(
                        request_id="eng-1",
                        cell_id="cell-1",
                        engine_id="engine-1",
                        address=engine_server.address,
                    )
                )
                token, execution_id = await register_token(stub)
                first = await complete(proxy.url, token, **{"Idempotency-Key": "turn-1"})
            assert first["choices"][0]["message"]["content"] == "Answer 1."
            proxy.kill()  # say its connection broke before the harness read the answer
            await proxy.start()
            retried = await complete(proxy.url, token, **{"Idempotency-Key": "turn-1"})
            fresh = await complete(proxy.url, token, **{"Idempotency-Key": "turn-2"})
            async with grpc.aio.insecure_channel(f"127.0.0.1:{proxy.grpc_port}") as channel:
                recorded = await revoke(proxy_pb2_grpc.ProxyServiceStub(channel), execution_id)
        finally:
            proxy.stop()
            await engine_server.stop(0.5)
    assert retried == first, "the same answer, the same completion id"
    assert fresh["choices"][0]["message"]["content"] == "Answer 2."
    assert len(engine.prompts) == 2, "the retry generated nothing"
    assert recorded == 2, "and recorded nothing"


@pytest_asyncio.fixture(loop_scope="session")
async def rig(kernel: KernelSettings, model_dir: Path) -> AsyncIterator[Rig]:
    rig = await start_rig(kernel, model_dir, num_engines=1)
    counting(rig.scripter)
    yield rig
    await rig.close()


async def test_a_plain_retry_of_a_call_recorded_but_not_delivered_gets_that_answer_once(rig: Rig) -> None:
    """The proxy restarts after the call's record committed and before the harness had the end
    of the stream; the harness sends the same request again (no key: it is derived from it)."""
    token, execution_id = await rig.register_execution()
    committed = asyncio.Event()
    held: list[asyncio.Future[bool]] = []
    real_finished = rig.proxy.calls.finished

    def finish_then_hang(run: Any) -> asyncio.Future[bool]:
        real_finished(run).add_done_callback(lambda f: committed.set())
        held.append(asyncio.get_running_loop().create_future())
        return held[-1]  # the final chunk waits for this, which the dying proxy never resolves

    rig.proxy.calls.finished = finish_then_hang  # type: ignore[method-assign]
    seen: list[str] = []

    async def harness_reads() -> None:
        async with aiohttp.ClientSession() as http:
            async with http.post(
                f"{rig.http_url}/v1/chat/completions",
                json={**BODY, "stream": True},
                headers={"Authorization": f"Bearer {token}"},
            ) as resp:
                async for line in resp.content:
                    seen.append(line.decode())

    reading = asyncio.create_task(harness_reads())
    await asyncio.wait_for(committed.wait(), timeout=20)
    held[0].set_exception(ConnectionResetError("the proxy process died"))
    await rig.restart_proxy()
    await asyncio.gather(reading, return_exceptions=True)
    assert not any("[DONE]" in line for line in seen), "the first attempt never completed"

    retried = await complete(rig.http_url, token)
    assert retried["choices"][0]["message"]["content"] == "Answer 1."
    assert len(rig.engines[0][1].prompts) == 1, "answered from the record, not generated again"
    # delivered whole now: the same request once more is a new call (a fresh sample)
    again = await complete(rig.http_url, token)
    assert again["choices"][0]["message"]["content"] == "Answer 2."
    assert await revoke(rig.stub, execution_id) == 2


async def test_a_retry_with_its_key_while_the_first_attempt_runs_joins_it(rig: Rig) -> None:
    token, execution_id = await rig.register_execution()
    engine = rig.engines[0][1]
    engine.token_interval_s = 0.05  # the first attempt is still generating when the retry comes
    try:
        first = asyncio.create_task(complete(rig.http_url, token, **{"Idempotency-Key": "slow"}))
        for _ in range(500):  # bounded: 5 s, until the first attempt generates
            if rig.proxy.calls.in_flight:
                break
            await asyncio.sleep(0.01)
        assert rig.proxy.calls.in_flight
        retried = await complete(rig.http_url, token, **{"Idempotency-Key": "slow"})
        assert retried == await first
    finally:
        engine.token_interval_s = 0.0
    assert len(engine.prompts) == 1
    assert await revoke(rig.stub, execution_id) == 1
