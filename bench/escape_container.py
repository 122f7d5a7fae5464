"""The escape corpus against the container backend: as the runner's harness in a task's image,
as tested code in the evaluator's grading container, and grades the tested code tries to forge.

The harness side goes through `ContainerSandbox` exactly as the runner starts one (scrub, agent
files, the workdir handed to the agent's uid, the forwarder relayed inside), with a fixture image
of `bench.dataset_fixtures` (built FROM the offline base, `gyre images base`). Attacks run one
after another so the host-side counts (processes of the agent's host uid) are theirs alone. The
grader side plants each attack as a `conftest.py` in the diff: it runs as the grading container's
root while pytest collects. Containment is judged by `bench.escape_attacks.judge`, from the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.dataset_fixtures import FIXTURES, build_image, image_tag, make_diff, write_task
from bench.escape_attacks import (
    ATTACKS,
    DEADLINE_S,
    LIMITS,
    Listener,
    Targets,
    attack_code,
    judge,
    uid_processes,
)
from gyre.sandbox.backend import ContainerLimits
from gyre.sandbox.host import Forward
from gyre.sandbox.limits import MIB
from gyre.sandbox.oci import Container, OciBackend, _run, find_engine
from gyre.sandbox.oci_policy import AGENT_UID
from services.evaluator.container_grading import ContainerGrader
from services.evaluator.container_task import ContainerTask, load_container_task
from services.runner.container_exec import ContainerSandbox, ContainerSpec

CONTAINER_LIMITS = ContainerLimits(
    cpus=LIMITS.cpus, memory_mb=LIMITS.memory_mb, storage_mb=LIMITS.disk_mb, max_procs=LIMITS.max_procs
)
ATTACK_FILE = "/tmp/gyre/attack.py"
GRADER_OUT = "/tmp/attack.out"
GRADE_DEADLINE_S = 30.0
FORGERIES = {
    # every test it runs reported as passed, by a hook in a conftest.py the diff adds
    "makereport": (
        "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n    outcome = yield\n    report = outcome.get_result()\n"
        "    report.outcome = 'passed'\n    report.longrepr = None\n"
    ),
    # PASSED lines for the FAIL_TO_PASS tests, then an exit before any test runs
    "summary_exit": (
        "import os, sys\n\n\ndef pytest_configure(config):\n    for test in {tests!r}:\n"
        "        print('PASSED ' + test)\n    sys.stdout.flush()\n    os._exit(0)\n"
    ),
}


async def container_attacks(
    t: Targets, forward: Forward, listener: Listener, root: Path
) -> list[dict[str, Any]]:
    """Every attack through a runner container and a grading container, then the forgeries; []
    when no container engine is here (the JSON's `container_backend` says so)."""
    if find_engine() is None:
        return []
    fixture = next(f for f in FIXTURES if f.family == "swebench")
    await asyncio.to_thread(build_image, fixture)
    backend = OciBackend()
    results = [
        await through_container(backend, image_tag(fixture), fixture.workdir, a, t, forward, listener, root)
        for a in ATTACKS
    ]
    # The grader's deadline and storage cut to the corpus's: attacks that sleep end with the
    # container, and `fill_disk` is judged against the quota the grading container had.
    loaded = load_container_task(write_task(fixture, root / "container-tasks"))
    task = dataclasses.replace(loaded, grader_timeout_s=GRADE_DEADLINE_S, limits=CONTAINER_LIMITS)
    grader = ContainerGrader(backend, attempts=1)
    for a in ATTACKS:
        results.append(await through_grader(grader, task, fixture.base, a, t, listener))
    for name, text in FORGERIES.items():
        results.append(await forge(grader, task, fixture.base, fixture.expected["empty"], name, text))
    return results


async def through_container(
    backend: OciBackend,
    image: str,
    workdir: str,
    name: str,
    t: Targets,
    forward: Forward,
    listener: Listener,
    root: Path,
) -> dict[str, Any]:
    sandbox = ContainerSandbox(root / "containers", f"atk-{name.replace('_', '-')}-{uuid.uuid4().hex[:6]}")
    spec = ContainerSpec(image=image, workdir=workdir, base_commit="", limits=CONTAINER_LIMITS)
    try:
        await sandbox.start(
            backend, spec, forward=forward, max_connections=LIMITS.max_connections, prompt="p"
        )
        assert sandbox.box is not None
        await sandbox.box.write_file(ATTACK_FILE, attack_code(name, t).encode())
        before = listener.hits
        await sandbox.launch(["python3", "-u", ATTACK_FILE], env={})
        outcome = await sandbox.wait(timeout_s=DEADLINE_S)
        await asyncio.sleep(0.3)
        output = sandbox.log_path.read_text(errors="replace") if sandbox.log_path.exists() else ""
        used = await sandbox.box.storage_used_mb() - sandbox.box.storage_base_mb
        contained, detail = judge_here(
            name,
            output,
            t,
            leftover=uid_processes(backend.host_uid(AGENT_UID)),
            used_bytes=int(max(0.0, used) * MIB),
            listener_hits=listener.hits - before,
            peak=sandbox.forwarder.peak if sandbox.forwarder is not None else 0,
        )
        ended = outcome.killed or f"exit {outcome.exit_code}"
        return {"via": "container", "attack": name, "contained": contained, "detail": detail, "ended": ended}
    finally:
        await sandbox.release()


async def through_grader(
    grader: ContainerGrader, task: ContainerTask, base: Any, name: str, t: Targets, listener: Listener
) -> dict[str, Any]:
    """The attack in the package the tests import (a conftest.py would be reset before the run):
    it runs as the grading container's root while pytest collects."""
    report = f"import sys\nsys.stdout = open({GRADER_OUT!r}, 'w', buffering=1)\n"
    package = next(f for f in base if f.endswith("/__init__.py") and not f.startswith("tests/"))
    diff = make_diff(base, {package: str(base[package]) + "\n" + report + attack_code(name, t)})
    seen: dict[str, Any] = {}
    original = grader.backend.create

    async def spy(**kwargs: Any) -> Container:  # watch the grading container from the host side
        box = await original(**kwargs)
        code, out, _ = await _run([*box.engine, "container", "inspect", "--format", "{{.Id}}", box.name])
        seen["id"] = out.decode().strip() if code == 0 else ""
        original_exec = box.exec

        async def exec_and_look(argv: Sequence[str], **kw: Any) -> Any:
            result = await original_exec(argv, **kw)
            if list(argv[:2]) == ["bash", "-lc"] and not box.closed:  # the test command
                with contextlib.suppress(Exception):
                    out = await box.download(GRADER_OUT)
                    seen["output"] = (out or b"").decode(errors="replace")
                    seen["used"] = await box.storage_used_mb() - box.storage_base_mb
            return result

        box.exec = exec_and_look  # type: ignore[method-assign]
        return box

    grader.backend.create = spy  # type: ignore[method-assign]
    before = listener.hits
    try:
        graded = await grader.grade(task, diff)
    finally:
        grader.backend.create = original  # type: ignore[method-assign]
    await asyncio.sleep(0.3)
    contained, detail = judge_here(
        name,
        seen.get("output", ""),
        t,
        leftover=cgroup_processes(seen.get("id", "")),  # after the grade: none may be left
        used_bytes=int(seen.get("used", 0.0) * MIB),
        listener_hits=listener.hits - before,
    )
    ended = graded.scored.reason[:60] or f"score {graded.scored.score:.2f}"
    return {
        "via": "container-grade",
        "attack": name,
        "contained": contained,
        "detail": detail,
        "ended": ended,
    }


def cgroup_processes(container_id: str) -> int:
    """Host processes still in the cgroup of the container with this id (it was removed)."""
    if not container_id:
        return 0
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError):
                n += container_id in (d / "cgroup").read_text()
    return n


def judge_here(name: str, output: str, t: Targets, **facts: Any) -> tuple[bool, str]:
    """`judge`, but a container's own /etc/shadow is the image's file, no host file: for
    `read_outside` the host's shadow must not show (with the secret, as everywhere)."""
    if name == "read_outside":
        host_shadow = Path("/etc/shadow").read_text()[:200]
        ok = t.secret not in output and host_shadow not in output
        return ok, "secret and the host's /etc/shadow not read" if ok else "a host file was read"
    return judge(name, output, t, **facts)


async def forge(
    grader: ContainerGrader, task: ContainerTask, base: Any, empty_score: float, name: str, text: str
) -> dict[str, Any]:
    """A diff that does not fix the bug but tries to make its tests report passing must earn no
    more than no change does."""
    diff = make_diff(base, {"conftest.py": text.format(tests=list(task.fail_to_pass))})
    graded = await grader.grade(task, diff)
    score = graded.scored.score
    return {
        "via": "container-grade",
        "attack": f"forge:container-{name}",
        "contained": score <= empty_score + 1e-6,
        "detail": f"score {score:.2f} (no change earns {empty_score:.2f})",
        "ended": graded.scored.reason[:60] or "graded",
    }
