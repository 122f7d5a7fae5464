"""One group of a SWE-bench-format task trains on the live stack, graded by its own tests.

`gyre tasks import` of the fixture rows, `gyre up --mode gyre` (every service, the torch engines,
embedded NATS and Postgres), then `gyre submit --task <imported task folder> --watch`: the runner
starts the agent in the task's own image against the proxy, the evaluator grades its diff with
the dataset's tests in a fresh container, and the trainer takes the group into an optimizer step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.dataset_images import build_image, import_fixtures
from gyre.sandbox.oci import find_engine
from gyre_app.images import DEFAULT_BASE, build_base
from services.evaluator.container_task import load_container_task

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(
        find_engine() is None, reason="no container engine (.ci/run installs podman and runc)"
    ),
]
REPO = Path(__file__).resolve().parent.parent


def gyre(env: dict[str, str], *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gyre_app.cli", *args],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip


@pytest.fixture
def stack() -> Iterator[tuple[dict[str, str], Path]]:
    """A stack of our own right under /tmp (the embedded PostgreSQL must reach its folder)."""
    root = Path(tempfile.mkdtemp(prefix="gyre-containers-e2e-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    env["GYRE_STATE_DIR"] = str(root / "state")
    try:
        up = gyre(env, "up", "--mode", "gyre")
        assert up.returncode == 0, up.stdout + up.stderr
        yield env, root
    finally:
        gyre(env, "down", timeout_s=120)
        shutil.rmtree(root, ignore_errors=True)


def test_a_swebench_group_is_graded_by_its_own_tests_and_trained(stack: tuple[dict[str, str], Path]) -> None:
    env, root = stack
    build_base(DEFAULT_BASE)
    # The importers' fixture rows through `gyre tasks import`, as a user would bring a dataset.
    folder = next(f for f in import_fixtures(root / "imported") if f.name == "gyre-fixtures__calc-1")
    build_image(load_container_task(folder))
    submitted = gyre(
        env, "submit", "--task", str(folder), "--group-size", "2", "--timeout-s", "90",
        "--watch", "--watch-timeout-s", "300", "--json", timeout_s=400,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    result = json.loads(submitted.stdout.strip().splitlines()[-1])
    task_id = result["tasks"][0]["task_id"]
    last = result["progress"][-1]
    assert last["ready"] and last["num_unassessable"] == 0, last
    # Whatever the untrained policy did, its own tests decided: P2P passes unless it broke them.
    assert all(r is not None and 0.0 <= r <= 1.0 for r in last["rewards"]), last

    trained: dict[str, Any] = {}
    for _ in range(120):  # bounded: 120 s
        status = gyre(env, "status", "--json", timeout_s=60)
        trained = json.loads(status.stdout.strip().splitlines()[-1]) if status.returncode == 0 else {}
        if task_id in (trained.get("last_step") or {}).get("task_ids", []):
            break
        time.sleep(1.0)
    assert task_id in trained["last_step"]["task_ids"], trained.get("last_step")
    assert trained["last_step"]["num_samples"] >= 1
