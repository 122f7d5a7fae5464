"""`gyre status` while things are away: it still answers (exit 0), naming NATS, Postgres and the
services that do not answer, and a service that runs while its database is away is said to run."""

from __future__ import annotations

import asyncio
import json
import socket

import grpc
import pytest

from gyre.outages import DEPENDENCY_AWAY
from gyre_app.cli import main as gyre
from gyre_app.client.api import _translate

pytestmark = pytest.mark.asyncio(loop_scope="session")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_status_names_what_is_away_and_still_answers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    monkeypatch.setenv("GYRE_NATS_URL", f"nats://127.0.0.1:{closed_port()}")
    monkeypatch.setenv(
        "GYRE_DATABASE_URL", f"postgresql+asyncpg://postgres@127.0.0.1:{closed_port()}/postgres"
    )
    monkeypatch.setenv("GYRE_STATE_DIR", str(tmp_path))
    for service in ("scheduler", "runner", "trajectory", "trainer", "evaluator"):
        monkeypatch.setenv(f"GYRE_{service.upper()}_ADDRESS", f"127.0.0.1:{closed_port()}")
    capsys.readouterr()
    assert await asyncio.to_thread(gyre, ["status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
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
