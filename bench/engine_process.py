"""Engines as processes of their own, as `gyre up` runs them (shell: subprocesses).

In-process engines share one interpreter, so one GIL, with every other service of the rig; on a
cluster each engine is a process of its own cell. `bench.live` runs them apart so that a cell's
decoding does not wait for the proxy, the trainer or the other engine's Python.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gyre.settings import KernelSettings

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 300.0  # importing torch on a loaded machine takes minutes
STOP_TIMEOUT_S = 10.0


def engine_env(kernel: KernelSettings, model_dir: Path, cell_id: str) -> dict[str, str]:
    """The engine's settings, the rig's servers and bus prefix (what `gyre up` tells an engine)."""
    return {
        **os.environ,
        "GYRE_NATS_URL": kernel.nats_url or "",
        "GYRE_DATABASE_URL": kernel.database_url or "",
        "GYRE_BUS_PREFIX": kernel.bus_prefix,
        "GYRE_ENGINE_MODEL_DIR": str(model_dir),
        "GYRE_ENGINE_ENGINE_ID": f"engine-{cell_id}",
        "GYRE_ENGINE_CELL_ID": cell_id,
        "GYRE_ENGINE_NUM_THREADS": "1",
        "GYRE_ENGINE_PUBLISH_EVENTS": "true",
        "GYRE_ENGINE_FOLLOW_WEIGHTS": "true",
        "GYRE_ENGINE_INIT_MODEL_IF_MISSING": "false",
    }


STARTED = re.compile(r"service_started\s+address=(\S+)\s+service=engine")


async def _serving(process: asyncio.subprocess.Process, log: Path) -> str:
    """The engine's address once it serves. It binds a free port itself (`--port 0`) and logs it:
    a port chosen here could be taken by another process before the engine binds it."""
    deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
    address = ""
    while not address:
        if process.returncode is not None:
            raise RuntimeError(f"engine exited {process.returncode}: see {log}")
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"engine not started after {START_TIMEOUT_S} s: see {log}")
        found = STARTED.search(await asyncio.to_thread(log.read_text, errors="replace"))
        address = found.group(1) if found else ""
        await asyncio.sleep(0.2)
    async with grpc.aio.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while True:
            if process.returncode is not None:
                raise RuntimeError(f"engine at {address} exited {process.returncode}: see {log}")
            try:
                answer = await health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return address
            except grpc.aio.AioRpcError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"engine at {address} not serving after {START_TIMEOUT_S} s: see {log}")
            await asyncio.sleep(0.2)


@asynccontextmanager
async def engine_processes(
    kernel: KernelSettings, model_dir: Path, cell_ids: Sequence[str], log_dir: Path
) -> AsyncIterator[list[str]]:
    """Start one engine process per cell; yield their addresses; stop them (ours, by PID)."""
    await asyncio.to_thread(log_dir.mkdir, parents=True, exist_ok=True)
    processes: list[asyncio.subprocess.Process] = []
    try:
        for cell_id in cell_ids:
            log = log_dir / f"engine-{cell_id}.log"
            with log.open("ab") as out:
                process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "services.engine",
                    "--port",
                    "0",
                    cwd=REPO,
                    env=engine_env(kernel, model_dir, cell_id),
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                )
            processes.append(process)
        yield [
            await _serving(process, log_dir / f"engine-{cell_id}.log")
            for process, cell_id in zip(processes, cell_ids, strict=True)
        ]
    finally:
        for process in processes:
            if process.returncode is None:
                process.terminate()
        for process in processes:
            try:
                await asyncio.wait_for(process.wait(), timeout=STOP_TIMEOUT_S)
            except TimeoutError:
                process.kill()
                await process.wait()
