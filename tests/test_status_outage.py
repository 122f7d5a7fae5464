"""`gyre status` while things are away: it still answers (exit 0), naming NATS, Postgres and the
services that do not answer, and a service that runs while its database is away is said to run."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
from pathlib import Path

import grpc
import pytest

from gyre.outages import DEPENDENCY_AWAY
from gyre_app.client.api import _translate

SERVICES = ("scheduler", "runner", "trajectory", "trainer", "evaluator")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.asyncio(loop_scope="session")
async def test_status_names_what_is_away_and_still_answers(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GYRE_NATS_URL": f"nats://127.0.0.1:{closed_port()}",
        "GYRE_DATABASE_URL": f"postgresql+asyncpg://postgres@127.0.0.1:{closed_port()}/postgres",
        "GYRE_STATE_DIR": str(tmp_path),
        **{f"GYRE_{s.upper()}_ADDRESS": f"127.0.0.1:{closed_port()}" for s in SERVICES},
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gyre_app.cli", "status", "--json",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode()
    status = json.loads(out.decode().strip().splitlines()[-1])
    deps = status["dependencies"]
    assert deps["nats"].startswith("away: NATS at nats://127.0.0.1:")
    assert deps["postgres"].startswith("away: Postgres at")
    assert deps["dead_letters"] == "unknown: NATS is away"
    assert status["services"]["trainer"].startswith("unreachable")
    assert "not reachable" in status["trainer"]["not_available"]
    assert "not_available" in status["waiting"]


def test_a_service_whose_database_is_away_is_said_to_run() -> None:
    away = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), DEPENDENCY_AWAY
    )
    said = str(_translate("trainer", "127.0.0.1:1", away))
    assert said == f"the trainer service at 127.0.0.1:1 runs, but {DEPENDENCY_AWAY}"
    gone = grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        "failed to connect to all addresses",
    )
    assert "is not reachable" in str(_translate("trainer", "127.0.0.1:1", gone))
