"""The escape corpus run through the sandbox as the runner launches harnesses, and through the
evaluator's grader: attacks, forged grades and workspaces that try to avoid a grade."""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from bench.escape_attacks import DEADLINE_S, LIMITS, Listener, Targets, attack_code, judge, uid_processes
from bench.forgery import BASELINE, CORRECT, forged_workspace
from gyre.sandbox.host import Forward, SandboxHost
from gyre.sandbox.limits import SandboxLimits
from gyre.sandbox.trees import folder_bytes, remove_tree
from services.evaluator.grading import Grader
from services.evaluator.taskset import BUNDLED, load_task


async def through_runner(
    host: SandboxHost, name: str, t: Targets, forward: Forward, listener: Listener
) -> dict[str, Any]:
    box = await host.create(f"bench-{name}-{uuid.uuid4().hex[:6]}", LIMITS)
    try:
        script = box.home / "attack.py"
        script.write_text(attack_code(name, t))
        box.own_files()
        await box.launch(
            [sys.executable, "-u", str(script)],
            env={"PATH": f"{os.path.dirname(sys.executable)}:/usr/bin:/bin"},
            forward=forward,
        )
        before = listener.hits
        outcome = await box.wait(timeout_s=DEADLINE_S)
        await asyncio.sleep(0.3)
        output = box.log_path.read_text(errors="replace") if box.log_path.exists() else ""
        contained, detail = judge(
            name,
            output,
            t,
            leftover=uid_processes(box.uid),
            used_bytes=folder_bytes(box.path),
            listener_hits=listener.hits - before,
            peak=box.forwarder.peak if box.forwarder is not None else 0,
        )
        return {
            "via": "runner",
            "attack": name,
            "contained": contained,
            "detail": detail,
            "ended": outcome.killed or f"exit {outcome.exit_code}",
        }
    finally:
        await box.release()


async def through_evaluator(
    grader: Grader, task_dir: Path, name: str, t: Targets, listener: Listener, work: Path
) -> dict[str, Any]:
    ws = work / f"ws-{name}"
    (ws / "wordfreq").mkdir(parents=True)
    # pytest captures the tested code's stdout: the attack reports into its sandbox's /tmp instead
    report = "import sys\nsys.stdout = open('/tmp/attack.out', 'w', buffering=1)\n"
    (ws / "wordfreq" / "__init__.py").write_text(report + attack_code(name, t))
    task = load_task(str(task_dir))
    seen: dict[str, Any] = {}
    original = grader.host.create

    async def spy(n: str, limits: SandboxLimits) -> Any:  # watch the grading sandbox from the host side
        box = await original(n, limits)
        original_wait = box.wait

        async def wait(*, timeout_s: float) -> Any:
            result = await original_wait(timeout_s=timeout_s)
            await asyncio.sleep(0.3)
            out = box.path / "tmp" / "attack.out"
            seen.update(
                output=out.read_text(errors="replace") if out.is_file() else "",
                leftover=uid_processes(box.uid),
                used=folder_bytes(box.path),
            )
            return result

        box.wait = wait  # type: ignore[method-assign]
        return box

    grader.host.create = spy  # type: ignore[method-assign]
    before = listener.hits
    try:
        graded = await grader.grade(task, ws)
    finally:
        grader.host.create = original  # type: ignore[method-assign]
    contained, detail = judge(
        name,
        seen.get("output", ""),
        t,
        leftover=seen.get("leftover", 0),
        used_bytes=seen.get("used", 0),
        listener_hits=listener.hits - before,
    )
    return {
        "via": "evaluator",
        "attack": name,
        "contained": contained,
        "detail": detail,
        "ended": graded.scored.reason[:80] or "graded",
    }


async def forgery(grader: Grader, name: str, work: Path) -> dict[str, Any]:
    """A workspace that tries to forge its grade must earn no more than its wrong code does."""
    ws = work / f"forged-{name}"
    for rel, text in forged_workspace(name).items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    graded = await grader.grade(load_task("wordfreq"), ws)
    score = graded.scored.score
    return {
        "via": "evaluator",
        "attack": f"forge:{name}",
        "contained": score <= BASELINE,
        "detail": f"score {score:g} (wrong code earns {BASELINE:g})",
        "ended": graded.scored.reason[:80] or "graded",
    }


UNGRADED = ("deep_chain", "many_files", "endless_loop", "dev_zero_result")
"""Workspaces of issue 16 (cases 6, 7) that made grading crash, cost time before the deadline
started, or earned `not assessable` instead of 0."""


def _write(ws: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)


def deep_chain(ws: Path, depth: int) -> None:
    """`depth` nested folders `d/d/...` under `ws`."""
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):  # relative to a descriptor: no path grows past PATH_MAX
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)


def _quick_task(work: Path, bundled: str, *, timeout_s: float) -> Path:
    """A bundled task with a short grader deadline, so a hang costs seconds, not a minute."""
    folder = work / f"task-{bundled}-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True)
    for sub in ("hidden",):
        (folder / sub).mkdir()
        for f in (BUNDLED / bundled / sub).iterdir():
            (folder / sub / f.name).write_bytes(f.read_bytes())
    lines = (BUNDLED / bundled / "task.toml").read_text().splitlines()
    (folder / "task.toml").write_text(
        "\n".join(f"grader_timeout_s = {timeout_s}" if x.startswith("grader_timeout_s") else x for x in lines)
    )
    return folder


async def ungraded_case(grader: Grader, name: str, work: Path) -> dict[str, Any]:
    """A workspace that tries to avoid a grade: it must get an assessable score of 0 with a reason."""
    ws = work / f"ungraded-{name}"
    ws.mkdir(parents=True)
    task = "wordfreq"
    if name == "deep_chain":  # a correct solution beside 1,100 nested folders
        _write(ws, CORRECT)
        deep_chain(ws, 1100)
    elif name == "many_files":  # a correct solution beside 150k empty files
        _write(ws, CORRECT)
        (ws / "junk").mkdir()
        for i in range(150_000):
            (ws / "junk" / str(i)).touch()
    elif name == "endless_loop":
        _write(ws, {**CORRECT, "wordfreq/__init__.py": "while True:\n    pass\n"})
        task = str(_quick_task(work, "wordfreq", timeout_s=4))
    elif name == "dev_zero_result":
        _write(ws, {"names.txt": "ann\nbob"})
        os.symlink("/dev/zero", ws / "total.txt")
        task = str(_quick_task(work, "csvsum", timeout_s=4))
    try:
        graded = await grader.grade(load_task(task), ws)
        ok = graded.scored.assessable and graded.scored.score == 0.0
        detail = f"score {graded.scored.score:g}, assessable {graded.scored.assessable}"
        ended = graded.scored.reason[:80] or "graded"
    except Exception as exc:  # what issue 16 found: a crash is no grade at all
        ok, detail, ended = False, f"no grade: {type(exc).__name__}: {exc}"[:120], "crashed"
    finally:
        await asyncio.to_thread(remove_tree, ws)
    return {
        "via": "evaluator",
        "attack": f"ungraded:{name}",
        "contained": ok,
        "detail": detail,
        "ended": ended,
    }


BENIGN = """
import os, time, urllib.request
open("ok.txt", "w").write("ok")
time.sleep(3)
url = os.environ["BASE"] + "/v1/chat/completions"
print(urllib.request.urlopen(url, data=b"{}", timeout=5).status)
"""


async def benign(host: SandboxHost, forward: Forward) -> bool:
    """A well-behaved execution beside the attacks: it must finish normally, its files intact."""
    box = await host.create(f"bench-benign-{uuid.uuid4().hex[:6]}", LIMITS)
    try:
        box.own_files()
        await box.launch([sys.executable, "-c", BENIGN], env={"BASE": box.base_url(forward)}, forward=forward)
        outcome = await box.wait(timeout_s=30)
        return outcome.exit_code == 0 and (box.work / "ok.txt").read_text() == "ok"
    finally:
        await box.release()
