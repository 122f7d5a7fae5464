"""Container tasks graded by their own tests in their own image, on the local Podman (live).

The images are built here, offline: the base with `gyre images base` (mmdebstrap; minutes, once
per machine) and each fixture's image FROM it (about a second each).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from bench.dataset_fixtures import FIXTURES, Fixture, build_image, case_diff, image_tag, write_task
from bench.datasets import forged_diff
from gyre.common.v1 import ids_pb2
from gyre.errors import InvalidArgument
from gyre.evaluator.v1 import evaluator_pb2, evaluator_pb2_grpc
from gyre.sandbox.backend import ContainerLimits
from gyre.sandbox.oci import OciBackend, find_engine
from gyre.settings import KernelSettings
from gyre_app.container_tasks import container_specs
from gyre_app.images import DEFAULT_BASE, build_base
from services.evaluator.cli import run as evaluate
from services.evaluator.config import EvaluatorSettings
from services.evaluator.container_grading import ContainerGrader
from services.evaluator.container_task import AGENT_DIFF, AGENT_LOG, ContainerTask, load_container_task
from services.evaluator.main import build

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_engine() is None, reason="no container engine (.ci/run installs podman and runc)"
    ),
]
BY_NAME = {f.name: f for f in FIXTURES}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ContainerTask]]:
    build_base(DEFAULT_BASE)
    out = tmp_path_factory.mktemp("container-tasks")
    loaded = {}
    for fixture in (BY_NAME["mini-calc-1"], BY_NAME["answer-harbor-4"]):
        build_image(fixture)
        loaded[fixture.name] = load_container_task(write_task(fixture, out))
    yield loaded


def grade(task: ContainerTask, diff: bytes) -> Any:
    return asyncio.run(ContainerGrader(OciBackend()).grade(task, diff))


@pytest.mark.parametrize("case", ["gold", "empty", "wrong", "cheat"])
def test_a_swebench_diff_gets_the_grade_its_tests_give(tasks: dict[str, ContainerTask], case: str) -> None:
    fixture = BY_NAME["mini-calc-1"]
    graded = grade(tasks[fixture.name], case_diff(fixture, case))
    assert graded.scored.assessable, graded.scored.reason
    assert graded.scored.score == pytest.approx(fixture.expected[case])
    if case == "cheat":  # the test patch overwrote the agent's edit, and the reviewer is told
        assert graded.signals == ("diff edits files the test patch overwrites: tests/test_calc.py",)


@pytest.mark.parametrize(
    ("case", "why"), [("forged_log", "never reported"), ("forged_reports", "skipped canary")]
)
def test_tested_code_that_forges_pytests_summary_or_reports_scores_zero(
    tasks: dict[str, ContainerTask], case: str, why: str
) -> None:
    graded = grade(tasks["mini-calc-1"], forged_diff(BY_NAME["mini-calc-1"], case))
    assert (graded.scored.score, graded.scored.assessable) == (0.0, True)
    assert why in graded.scored.reason


def test_a_conftest_hook_that_passes_every_test_is_reset_before_the_tests_run(
    tasks: dict[str, ContainerTask],
) -> None:
    graded = grade(tasks["mini-calc-1"], forged_diff(BY_NAME["mini-calc-1"], "forged_hook"))
    assert graded.scored.score == pytest.approx(BY_NAME["mini-calc-1"].expected["empty"])  # no change's grade
    assert graded.signals == ("diff changes how tests run: conftest.py",)


def test_a_diff_that_does_not_apply_is_an_assessable_zero_with_the_reason(
    tasks: dict[str, ContainerTask],
) -> None:
    bad = b"diff --git a/mini/calc.py b/mini/calc.py\n--- a/mini/calc.py\n+++ b/mini/calc.py\n"
    bad += b"@@ -1,2 +1,2 @@\n-def nothing_like_this():\n+def other():\n     pass\n"
    graded = grade(tasks["mini-calc-1"], bad)
    assert (graded.scored.score, graded.scored.assessable) == (0.0, True)
    assert "agent's diff does not apply" in graded.scored.reason


@pytest.mark.parametrize("case", ["gold", "wrong", "cheat"])
def test_a_harbor_verifier_runs_its_hidden_tests_after_the_agent(
    tasks: dict[str, ContainerTask], case: str
) -> None:
    fixture = BY_NAME["answer-harbor-4"]
    graded = grade(tasks[fixture.name], case_diff(fixture, case))
    assert (graded.scored.score, graded.scored.assessable) == (fixture.expected[case], True)


def test_a_container_has_no_network_and_its_limits(tasks: dict[str, ContainerTask]) -> None:
    async def probe() -> tuple[Any, Any]:
        backend = OciBackend()
        limits = ContainerLimits(cpus=0.5, memory_mb=256, storage_mb=64, max_procs=64)
        box = await backend.create(
            name=f"gyre-test-{uuid.uuid4().hex[:8]}", image=DEFAULT_BASE, limits=limits
        )
        try:
            net = await box.exec(
                ["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)"],
                timeout_s=30,
            )
            big = await box.exec(["sh", "-c", "head -c 100000000 /dev/zero > /big"], timeout_s=60)
            return net, big
        finally:
            await box.close()

    net, big = asyncio.run(probe())
    assert net.exit_code != 0 and b"Network is unreachable" in net.output
    assert big.storage_exceeded


def test_gyre_evaluate_grades_a_patch_and_refuses_a_missing_image(
    tasks: dict[str, ContainerTask], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fixture: Fixture = BY_NAME["mini-calc-1"]
    patch = tmp_path / "gold.diff"
    patch.write_bytes(case_diff(fixture, "gold"))
    folder = str(shutil.copytree(tasks[fixture.name].folder, tmp_path / fixture.name))
    assert evaluate(["--task", folder, "--patch", str(patch), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (result["score"], result["assessable"], result["details"]["family"]) == (1.0, True, "swebench")

    toml = Path(folder) / "task.toml"
    toml.write_text(toml.read_text().replace(image_tag(fixture), "localhost/gyre-no-such-image:0"))
    assert evaluate(["--task", folder, "--patch", str(patch), "--json"]) == 2
    err = capsys.readouterr().err
    assert "environment.image" in err and "gyre-no-such-image" in err


@pytest.mark.asyncio(loop_scope="session")
async def test_the_evaluator_grades_the_diff_a_runner_exported(
    tasks: dict[str, ContainerTask], kernel: KernelSettings, tmp_path: Path
) -> None:
    fixture = BY_NAME["mini-calc-1"]
    host = await build(EvaluatorSettings(), kernel)
    await host.start()
    channel = grpc.aio.insecure_channel(host.address)
    try:
        stub = evaluator_pb2_grpc.EvaluatorServiceStub(channel)
        graded = {}
        for case in ("cheat", "none"):
            ws = tmp_path / case
            ws.mkdir()
            if case == "cheat":
                (ws / AGENT_DIFF).write_bytes(case_diff(fixture, case))
                (ws / AGENT_LOG).write_text("$ git reflog\n")
            request = evaluator_pb2.GradeWorkspaceRequest(
                request_id=f"c-{uuid.uuid4().hex[:8]}",
                execution=ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=str(uuid.uuid4())),
                family="swebench",
                task=str(tasks[fixture.name].folder),
                workspace_uri=ws.as_uri(),
            )
            graded[case] = (await stub.GradeWorkspace(request)).grade
    finally:
        await channel.close()
        await host.stop()
    cheat = graded["cheat"]
    assert (cheat.score, cheat.assessable, cheat.grader) == (pytest.approx(0.3), True, "swebench@1")
    assert list(cheat.signals) == [
        "diff edits files the test patch overwrites: tests/test_calc.py",
        "agent ran git history commands: git reflog",
    ]
    assert not graded["none"].assessable and "no agent.diff" in graded["none"].unassessable_reason


def test_a_task_set_is_submitted_one_group_a_task_and_a_missing_image_is_refused(
    tasks: dict[str, ContainerTask], tmp_path: Path
) -> None:
    calc = tasks["mini-calc-1"]
    shutil.copytree(calc.folder, tmp_path / calc.name)
    manifest = {"seed": None, "families": ["swebench"], "splits": {"train": [calc.name], "heldout": []}}
    (tmp_path / "taskset.json").write_text(json.dumps(manifest))
    (spec,) = container_specs(tmp_path, group_size=2, timeout_s=60.0, harness="gyre-agent")
    assert (spec.name, spec.family, spec.group_size, spec.workspace_template) == (
        calc.name,
        "swebench",
        2,
        "",
    )
    assert dict(spec.labels) == {"gyre.task": str((tmp_path / calc.name).resolve())}

    missing = tmp_path / "gone"
    shutil.copytree(calc.folder, missing)
    toml = missing / "task.toml"
    toml.write_text(toml.read_text().replace(calc.image, "localhost/gyre-no-such-image:0"))
    manifest["splits"]["train"] = [calc.name, "gone"]  # type: ignore[index]
    (tmp_path / "taskset.json").write_text(json.dumps(manifest))
    with pytest.raises(InvalidArgument) as err:
        container_specs(tmp_path, group_size=2, timeout_s=60.0, harness="gyre-agent")
    assert err.value.field == f"{toml}: environment.image" and "gyre-no-such-image" in err.value.problem


def test_gyre_images_base_skips_a_tag_already_present(tasks: dict[str, ContainerTask]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gyre_app.cli", "images", "base", "--tag", DEFAULT_BASE, "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["tag"], result["built"], result["present"]) == (DEFAULT_BASE, False, True)


def test_a_sweep_removes_only_its_owners_containers(tasks: dict[str, ContainerTask]) -> None:
    async def run() -> tuple[int, bool, bool]:
        backend = OciBackend()
        owner = f"test:{uuid.uuid4().hex[:8]}"
        limits = ContainerLimits(memory_mb=128)
        mine = await backend.create(
            name=f"gyre-test-{uuid.uuid4().hex[:8]}", image=DEFAULT_BASE, limits=limits, owner=owner
        )
        other = await backend.create(
            name=f"gyre-test-{uuid.uuid4().hex[:8]}", image=DEFAULT_BASE, limits=limits
        )
        try:
            swept = await backend.sweep(owner)
            return swept, await mine.alive(), await other.alive()
        finally:
            await other.close()

    assert asyncio.run(run()) == (1, False, True)
