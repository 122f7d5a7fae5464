"""An engine killed mid-generation: its call goes on on the other engine from the tokens so far,
and the harness reads one unbroken answer (two scripted engine processes, one killed with SIGKILL)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from proxy_support import Rig, start_rig, write_tokenizer

from gyre.devstack.embedded import free_port
from gyre.proxy.v1 import proxy_pb2
from gyre.settings import KernelSettings

pytestmark = pytest.mark.asyncio(loop_scope="session")
NUM_TOKENS = 40
TOKEN_INTERVAL_S = 0.05
STALL_S = 3.0
"""The proxy's stall timeout in the hang test: 60 token intervals, so a loaded machine's pauses
between tokens do not pass for a hang."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest_asyncio.fixture(loop_scope="session")
async def rig(kernel: KernelSettings, model_dir: Path) -> AsyncIterator[Rig]:
    rig = await start_rig(kernel, model_dir, num_engines=0)
    yield rig
    await rig.close()


def spawn_engine(engine_id: str, port: int, stop_id: int, log: Path) -> subprocess.Popen[bytes]:
    args = [
        *("--port", str(port), "--tokens", str(NUM_TOKENS), "--stop-id", str(stop_id)),
        *(
            "--token-interval-s",
            str(TOKEN_INTERVAL_S),
            "--engine-id",
            engine_id,
            "--cell-id",
            f"cell-{engine_id}",
        ),
        "--continue",
    ]
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "bench.scripted_engine", *args], stdout=out, stderr=out
        )


async def serving(port: int, process: subprocess.Popen[bytes]) -> None:
    for _ in range(600):  # bounded: 60 s
        assert process.poll() is None, "the engine process exited"
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise AssertionError(f"engine on port {port} did not serve in time")


async def start_engines(
    rig: Rig, engines: dict[str, subprocess.Popen[bytes]], stop_id: int, logs: Path
) -> None:
    """Two scripted engine processes, registered with the proxy."""
    for engine_id in ("engine-a", "engine-b"):
        port = free_port()
        process = spawn_engine(engine_id, port, stop_id, logs / f"{engine_id}.log")
        engines[engine_id] = process
        await serving(port, process)
        await rig.stub.RegisterEngine(
            proxy_pb2.RegisterEngineRequest(
                request_id=f"reg-{engine_id}-{port}",
                cell_id=f"cell-{engine_id}",
                engine_id=engine_id,
                address=f"127.0.0.1:{port}",
            )
        )


async def signal_its_engine(
    rig: Rig, engines: dict[str, subprocess.Popen[bytes]], signum: int, hit: list[str]
) -> None:
    """Send `signum` to the engine of the call in flight once it has a few tokens."""
    for _ in range(1000):  # bounded: 10 s, until the call has a few tokens
        runs = list(rig.proxy.calls.in_flight.values())
        if runs and len(runs[0].generation.output_ids) >= 5:
            hit.append(runs[0].generation.route.engine_id)
            os.kill(engines[hit[0]].pid, signum)
            return
        await asyncio.sleep(0.01)


async def stream_text(rig: Rig, token: str) -> tuple[str, list[str]]:
    """The answer's text as the harness reads it from the SSE stream, and every data line."""
    lines: list[str] = []
    text = ""
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{rig.http_url}/v1/chat/completions",
            json={"model": "tiny", "stream": True, "messages": [{"role": "user", "content": "Go on."}]},
            headers={"Authorization": f"Bearer {token}"},
        ) as resp:
            assert resp.status == 200
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                lines.append(line)
                if line == "data: [DONE]":
                    continue
                delta = json.loads(line[6:])["choices"]
                if delta and delta[0]["delta"].get("content"):
                    text += delta[0]["delta"]["content"]
    return text, lines


@pytest_asyncio.fixture(loop_scope="session")
async def engines(rig: Rig, tmp_path: Path) -> AsyncIterator[dict[str, subprocess.Popen[bytes]]]:
    """Two scripted engine processes behind the proxy, killed at the end (stopped ones too)."""
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        await start_engines(rig, processes, stop_id(rig), tmp_path)
        yield processes
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()  # SIGKILL ends a stopped process too
            process.wait(5)


def stop_id(rig: Rig) -> int:
    return int(rig.scripter.tokenizer.convert_tokens_to_ids("<|im_end|>"))


def scripted_reply(rig: Rig) -> list[int]:
    """What bench.scripted_engine answers."""
    return [100 + i % 200 for i in range(NUM_TOKENS - 1)] + [stop_id(rig)]


async def test_a_call_on_an_engine_killed_mid_stream_ends_on_the_other_engine_unbroken(
    rig: Rig, engines: dict[str, subprocess.Popen[bytes]]
) -> None:
    token, execution_id = await rig.register_execution()
    killed: list[str] = []
    killer = asyncio.create_task(signal_its_engine(rig, engines, signal.SIGKILL, killed))
    text, lines = await stream_text(rig, token)
    await killer
    assert killed, "the engine was killed while it generated"
    assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines), lines[-3:]
    # The same request again (a new call: the first answer was delivered) runs on the survivor whole.
    again, _ = await stream_text(rig, token)
    survivor = ({"engine-a", "engine-b"} - set(killed)).pop()
    reply = scripted_reply(rig)
    first, second = await rig.records(execution_id, at_least=2)
    assert list(first.output_ids) == reply, "one output: the tokens before the kill, then the rest"
    assert (first.engine_id, first.num_migrations) == (survivor, 1)
    assert len(first.output_logprobs) == len(reply)
    assert (second.engine_id, second.num_migrations, list(second.output_ids)) == (survivor, 0, reply)
    assert text == again, "the harness read the same text as from an engine that never died"
    revoke = proxy_pb2.RevokeExecutionTokenRequest(
        request_id=f"rev-{execution_id}", execution_id=execution_id
    )
    revoked = await rig.stub.RevokeExecutionToken(revoke)
    assert revoked.num_calls_failed_by_proxy == 0, "failed over: the harness never saw the engine's loss"


async def test_a_call_on_an_engine_that_hangs_with_its_stream_open_ends_on_the_other_engine(
    rig: Rig, engines: dict[str, subprocess.Popen[bytes]]
) -> None:
    """SIGSTOP: the engine's connection stays open and sends nothing, so only the stall timeout
    can tell the call's stream is dead."""
    token, execution_id = await rig.register_execution()
    frozen: list[str] = []
    rig.proxy.calls.engine_stall_s = STALL_S
    try:
        freezer = asyncio.create_task(signal_its_engine(rig, engines, signal.SIGSTOP, frozen))
        text, lines = await stream_text(rig, token)
        await freezer
    finally:
        rig.proxy.calls.engine_stall_s = 0.0
    assert frozen, "the engine hung while it generated"
    assert lines[-1] == "data: [DONE]" and not any('"error"' in line for line in lines), lines[-3:]
    survivor = ({"engine-a", "engine-b"} - set(frozen)).pop()
    (record,) = await rig.records(execution_id, at_least=1)
    assert list(record.output_ids) == scripted_reply(rig), "the tokens before the hang, then the rest"
    assert (record.engine_id, record.num_migrations) == (survivor, 1)
    assert text, "the harness read the answer"
