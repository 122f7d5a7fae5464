"""Images and graded cases for the imported fixtures of tests/data/datasets (shell: podman, git).

`gyre tasks import` turns the fixture rows and Harbor folders into task folders that name an
image; no registry holds those images, so this builds each one offline FROM the base image:
a SWE-bench-form or R2E-Gym row's repository committed at /testbed by `repos/commit_base.sh`
(so the commit is the row's `base_commit`; R2E-Gym's `run_tests.sh` and `r2e_tests` go to
/root), a Harbor folder's own `environment/Dockerfile`. It also makes the diffs whose grade is
known: a row's gold and wrong patches, a Harbor solution's diff (its `solve.sh` run in the image),
and a cheat that rewrites the tests the test patch touches so every assertion holds.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

from gyre.sandbox.backend import ContainerLimits
from gyre.sandbox.oci import OciBackend, find_engine
from gyre_app.images import DEFAULT_BASE, image_exists
from services.evaluator.container_scoring import diff_files
from services.evaluator.container_task import ContainerTask
from services.runner.container_exec import ENSURE_REPO, EXPORT

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "datasets"
SOURCES = ("swebench.jsonl", "r2e.jsonl", "harbor")


def _run(argv: list[str], **kw: object) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, **kw)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} failed: {done.stderr[-1500:]}")
    return str(done.stdout)


def import_fixtures(out: Path) -> list[Path]:
    """`gyre tasks import` each fixture source into `out/<source>`; the task folders written."""
    folders = []
    out.mkdir(parents=True, exist_ok=True)
    for source in SOURCES:
        dest = out / source.split(".")[0]
        _run(
            [
                sys.executable,
                "-m",
                "gyre_app.cli",
                "tasks",
                "import",
                str(DATA / source),
                "--out",
                str(dest),
                "--json",
            ]
        )
        folders += sorted(p.parent for p in dest.glob("*/task.toml"))
    return folders


def build_image(task: ContainerTask, *, base: str = DEFAULT_BASE) -> bool:
    """The task's image under its own name; False when it was present already."""
    if image_exists(task.image):
        return False
    with tempfile.TemporaryDirectory(prefix="gyre-fixture-image-") as tmp:
        context = Path(tmp)
        if task.source_format == "harbor":
            environment = task.folder / "environment"
            _run([*_engine(), "build", "--network", "none", "-q", "-t", task.image, str(environment)])
            return True
        repo = task.repo.split("/")[-1]
        shutil.copytree(DATA / "repos" / repo, context / "repo")
        shutil.copy(DATA / "repos" / "commit_base.sh", context / "commit_base.sh")
        lines = [
            f"FROM {base}",
            f"COPY repo {task.workdir}",
            f"WORKDIR {task.workdir}",
            "COPY commit_base.sh /tmp/",
        ]
        if task.source_format == "r2e":
            shutil.copytree(DATA / "r2e" / repo, context / "r2e")
            lines += ["COPY r2e/run_tests.sh /root/run_tests.sh", "COPY r2e/r2e_tests /root/r2e_tests"]
        lines.append("RUN sh /tmp/commit_base.sh && rm /tmp/commit_base.sh")
        (context / "Containerfile").write_text("\n".join(lines) + "\n")
        containerfile = str(context / "Containerfile")
        _run(
            [
                *_engine(),
                "build",
                "--network",
                "none",
                "-q",
                "-t",
                task.image,
                "-f",
                containerfile,
                str(context),
            ]
        )
    return True


def _engine() -> list[str]:
    engine = find_engine()
    if engine is None:
        raise RuntimeError("no container engine: install podman and runc")
    return engine


def row_of(task: ContainerTask) -> dict[str, object]:
    for source in ("swebench.jsonl", "r2e.jsonl"):
        for line in (DATA / source).read_text().splitlines():
            row = json.loads(line)
            if task.source_id in (
                row.get("instance_id"),
                f"{row.get('repo_name')}__{row.get('commit_hash')}",
            ):
                return dict(row)
    raise KeyError(task.source_id)


def cheat_diff(task: ContainerTask) -> bytes:
    """The tests the test patch touches, after it, with every assertion made to hold: a diff that
    would pass FAIL_TO_PASS if the agent's edits to tests counted (the test patch must win)."""
    repo = task.repo.split("/")[-1]
    with tempfile.TemporaryDirectory(prefix="gyre-cheat-") as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(DATA / "repos" / repo, work)
        _run(["sh", str(DATA / "repos" / "commit_base.sh")], cwd=work)
        test_patch = task.test_patch.read_text()
        touched = diff_files(test_patch)
        if not touched:  # R2E-Gym: the tests live in the image, so plant a passing copy instead
            (work / "r2e_tests").mkdir(exist_ok=True)
            (work / "r2e_tests" / "test_1.py").write_text("def test_planted():\n    assert True\n")
        else:
            _run(["git", "apply", "--binary", "-"], cwd=work, input=test_patch)
            for rel in touched:
                path = work / rel
                if path.is_file():
                    text = re.sub(r"\bassert ", "assert True or ", path.read_text())
                    path.write_text(text.replace("self.assert", "True or self.assert"))
        _run(["git", "add", "-A"], cwd=work)
        return subprocess.run(
            ["git", "diff", "--cached", "--binary", "HEAD"], cwd=work, capture_output=True, check=True
        ).stdout


async def solution_diff(task: ContainerTask, backend: OciBackend) -> bytes:
    """A Harbor task's reference solution as a diff: `solve.sh` run in its image, the workdir
    exported as the runner exports an agent's work."""
    box = await backend.create(
        name=f"gyre-solve-{uuid.uuid4().hex[:8]}", image=task.image, limits=ContainerLimits(memory_mb=512)
    )
    try:
        await box.exec(["sh", "-c", ENSURE_REPO, "repo", task.workdir], timeout_s=60)
        await box.upload(str(task.folder / "hidden" / "solution"), "/tmp/solution")
        await box.exec(["bash", "/tmp/solution/solve.sh"], timeout_s=120, workdir=task.workdir)
        done = await box.exec(["sh", "-c", EXPORT, "export", task.workdir, "HEAD"], timeout_s=60)
        return done.output
    finally:
        await box.close()
