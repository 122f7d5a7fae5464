"""Generated contracts are fresh, and every service starts its CLI without any server."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gyre.codegen import stale_files
from gyre_app.stack import SERVICES


def test_committed_contracts_match_the_protos() -> None:
    assert stale_files() == [], "run `make proto` and commit the result"


@pytest.mark.parametrize("service", SERVICES)
def test_each_service_answers_help_with_no_server_running(service: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    env["GYRE_NATS_URL"] = "nats://127.0.0.1:1"  # unreachable: --help must not connect
    done = subprocess.run(
        [sys.executable, "-m", f"services.{service}", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert f"python -m services.{service}" in done.stdout and "GYRE_NATS_URL" in done.stdout
