"""`python -m gyre.healthcheck`: the container probe answers 0 only for a server that is SERVING."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from grpc_health.v1 import health_pb2

from gyre.devstack.embedded import free_port
from gyre.healthcheck import check
from gyre.rpc import GrpcServer


@pytest.mark.asyncio(loop_scope="session")
async def test_a_serving_server_passes_the_probe_process() -> None:
    server = GrpcServer(service_names=[], port=0)
    await server.start()
    try:
        probe = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "gyre.healthcheck", server.address],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        await server.stop(0)
    assert probe.returncode == 0, probe.stderr


@pytest.mark.asyncio(loop_scope="session")
async def test_a_stopping_server_is_reported_not_serving() -> None:
    server = GrpcServer(service_names=["gyre.test.v1.TestService"], port=0)
    await server.start()
    # NOT_SERVING, as `stop` reports it first
    await server.health.set("gyre.test.v1.TestService", health_pb2.HealthCheckResponse.NOT_SERVING)
    try:
        problem = await asyncio.to_thread(check, server.address, service="gyre.test.v1.TestService")
    finally:
        await server.stop(0)
    assert problem == "NOT_SERVING"


def test_nothing_listening_fails_the_probe_naming_the_address() -> None:
    address = f"127.0.0.1:{free_port()}"
    probe = subprocess.run(
        [sys.executable, "-m", "gyre.healthcheck", address, "--timeout-s", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 1
    assert f"{address}: not serving (UNAVAILABLE" in probe.stderr
