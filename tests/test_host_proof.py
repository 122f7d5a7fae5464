"""Failures a policy cannot fake (issue 27): an outcome is infrastructure only on host facts, the
sandbox's first process is out of the harness's reach, and a check script's verdicts cannot be
forged or silenced into `not assessable`.

The blame table is pure; the rest runs the real sandbox (SandboxHost -> keeper -> bwrap -> init)
and the real grader through `gyre-evaluate`. Needs root (users, namespaces, mounts), as CI runs.
"""

from __future__ import annotations

import errno
import json
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gyre.sandbox.blame import CANCELLED, INFRASTRUCTURE, POLICY, HostFacts, blame
from gyre.sandbox.host import Outcome, SandboxHost
from gyre.sandbox.keeper import LOG_LIMIT, Drain
from gyre.sandbox.limits import SandboxLimits
from services.evaluator.cli import run as evaluate

REPO = Path(__file__).resolve().parent.parent
LIMITS = SandboxLimits(cpu_s=30, memory_mb=512, max_procs=32, file_size_mb=8, disk_mb=32, cpus=0.5)
FORGED_SETUP = "gyre-sandbox: setup failed: [Errno 2] No such file or directory\nbwrap: cannot mount\n"

REACH = """
import ctypes, json, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
FORGED = FORGED_SETUP_TEXT
me = os.getpid()
others = [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) != me]
reached = {}
for pid in others:
    for what, flags in (("mem", os.O_RDWR), ("environ", os.O_RDONLY), ("fd/2", os.O_WRONLY)):
        try:
            fd = os.open(f"/proc/{pid}/{what}", flags)
        except OSError as e:
            reached[f"{pid}/{what}"] = e.errno
            continue
        reached[f"{pid}/{what}"] = "opened"
        if what == "fd/2":
            os.write(fd, FORGED.encode())
        os.close(fd)
    pidfd = libc.syscall(434, pid, 0)  # pidfd_open
    reached[f"{pid}/pidfd_open"] = "opened" if pidfd >= 0 else ctypes.get_errno()
    if pidfd >= 0:
        stolen = libc.syscall(438, pidfd, 2, 0)  # pidfd_getfd: init's stderr
        reached[f"{pid}/pidfd_getfd"] = "stolen" if stolen >= 0 else ctypes.get_errno()
families = {}
for name, family, kind in (("vsock", 40, socket.SOCK_STREAM), ("packet", 17, socket.SOCK_RAW),
                           ("netlink", 16, socket.SOCK_RAW), ("unix", 1, socket.SOCK_STREAM),
                           ("inet", 2, socket.SOCK_STREAM), ("inet6", 10, socket.SOCK_STREAM)):
    try:
        socket.socket(family, kind).close()
        families[name] = "ok"
    except OSError as e:
        families[name] = e.errno
print(json.dumps({"others": others, "reached": reached, "families": families}), flush=True)
sys.stderr.write(FORGED)
sys.exit(1)
""".replace("FORGED_SETUP_TEXT", repr(FORGED_SETUP))


@pytest.mark.parametrize(
    ("facts", "verdict", "kind"),
    [
        (HostFacts(started=False, setup_errno=errno.ENOENT), INFRASTRUCTURE, "harness_launch"),
        (HostFacts(started=False, setup_error="bwrap: cannot mount"), INFRASTRUCTURE, "sandbox"),
        (HostFacts(started=False, killed="deadline"), INFRASTRUCTURE, "sandbox"),
        (HostFacts(started=True, killed="keeper_lost"), INFRASTRUCTURE, "runner_lost"),
        (HostFacts(started=True, killed="runner stopped"), INFRASTRUCTURE, "runner_lost"),
        (HostFacts(started=True, exit_code=3, proxy_failed_calls=2), INFRASTRUCTURE, "model_unavailable"),
        (HostFacts(started=True, killed="cancelled"), CANCELLED, ""),
        (HostFacts(started=True, exit_code=0), POLICY, ""),
        (HostFacts(started=True, exit_code=1, setup_error="bwrap: forged"), POLICY, ""),
        (HostFacts(started=True, exit_code=137), POLICY, ""),
        (HostFacts(started=True, killed="deadline"), POLICY, ""),
        (HostFacts(started=True, killed="disk_quota", proxy_failed_calls=1), POLICY, ""),
        (HostFacts(started=True, exit_code=0, proxy_failed_calls=4), POLICY, ""),
    ],
)  # fmt: skip
def test_the_blame_table(facts: HostFacts, verdict: str, kind: str) -> None:
    blamed = blame(facts)
    assert (blamed.verdict, blamed.kind) == (verdict, kind), blamed.reason


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def reached() -> AsyncIterator[tuple[dict[str, Any], Outcome, str]]:
    host = SandboxHost(REPO / ".gyre" / "test-proof" / uuid.uuid4().hex[:8], uid_base=61200, uid_count=50)
    box = await host.create("reach", LIMITS)
    try:
        (box.home / "reach.py").write_text(REACH)
        box.own_files()
        await box.launch([sys.executable, "-u", str(box.home / "reach.py")], env={})
        outcome = await box.wait(timeout_s=30)
        output = await box.log_tail(100_000)
        setup_log = await box.log_tail(100_000, name="sandbox.log")
        yield json.loads(output.splitlines()[0]), outcome, setup_log
    finally:
        await box.release()
        host.sweep()
        host.root.rmdir()


@pytest.mark.asyncio(loop_scope="session")
async def test_the_sandboxs_first_process_is_out_of_the_harnesss_reach(
    reached: tuple[dict[str, Any], Outcome, str],
) -> None:
    report, _, setup_log = reached
    assert report["others"], "the sandbox's first process is visible: the attack had a target"
    opened = {k: v for k, v in report["reached"].items() if v in ("opened", "stolen")}
    assert not opened, opened
    assert "setup failed" not in setup_log, setup_log


@pytest.mark.asyncio(loop_scope="session")
async def test_only_unix_and_inet_sockets_can_be_made(reached: tuple[dict[str, Any], Outcome, str]) -> None:
    families = reached[0]["families"]
    assert {k: families[k] for k in ("vsock", "packet", "netlink")} == dict.fromkeys(
        ("vsock", "packet", "netlink"), errno.EAFNOSUPPORT
    )
    assert {k: families[k] for k in ("unix", "inet", "inet6")} == dict.fromkeys(
        ("unix", "inet", "inet6"), "ok"
    )


@pytest.mark.asyncio(loop_scope="session")
async def test_a_harness_that_prints_a_setup_failure_has_its_exit_graded(
    reached: tuple[dict[str, Any], Outcome, str],
) -> None:
    _, outcome, _ = reached
    assert outcome.started and outcome.exit_code == 1
    facts = HostFacts(started=outcome.started, setup_error=outcome.setup_error, exit_code=outcome.exit_code)
    assert blame(facts).verdict == POLICY


def check_task(tmp_path: Path) -> Path:
    """A terminal task whose check runs the workspace's program, with declared verdicts."""
    folder = tmp_path / "runcheck"
    (folder / "hidden").mkdir(parents=True)
    (folder / "workspace").mkdir()
    (folder / "task.toml").write_text(
        'name = "runcheck"\nfamily = "terminal"\nprompt = "Write run.py printing 42."\n'
        'requires = ["run.py"]\ngrader_timeout_s = 30\ncheck = "hidden/check.sh"\n'
        'verdicts = ["answer", "quiet"]\n'
    )
    (folder / "hidden" / "check.sh").write_text(
        "out=$(python run.py 2>/dev/null)\n"
        'if [ "$out" = "42" ]; then echo "PASS answer"; else echo "FAIL answer"; fi\n'
        'if [ -z "$(python run.py 2>&1 >/dev/null)" ]; then echo "PASS quiet"; else echo "FAIL quiet"; fi\n'
    )
    return folder


STEAL = """
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)


def write_into(pid, fd, data):
    # By the descriptor itself (pidfd_getfd: no file permission is checked), else by reopening it.
    pidfd = libc.syscall(434, int(pid), 0)
    stolen = libc.syscall(438, pidfd, fd, 0) if pidfd >= 0 else -1
    try:
        target = stolen if stolen >= 0 else os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY)
        os.write(target, data)
    except OSError:
        pass


def pids():
    return [int(d) for d in os.listdir("/proc") if d.isdigit() and int(d) != os.getpid()]
"""

ATTACKS = {
    # Writes PASS lines into every output of every process it can reach (the check's included),
    # then tries to kill the check before its FAIL lines come.
    "steal_the_check_output": STEAL
    + (
        "lines = b'PASS answer\\nPASS quiet\\n'\n"
        "for pid in pids():\n"
        "    for fd in (1, 2):\n"
        "        write_into(pid, fd, lines)\n"
        "sys.stderr.buffer.write(lines)\n"
        "os.kill(os.getppid(), signal.SIGKILL)\n"
    ),
    # Tells the host, through every stderr it can reach (the sandbox's first process's: the
    # host's set-up log on main), that the grading sandbox did not start: was three full
    # retries and `not assessable`.
    "forge_a_setup_failure": STEAL
    + (
        f"forged = {FORGED_SETUP!r}.encode()\n"
        "for pid in pids():\n"
        "    write_into(pid, 2, forged)\n"
        "sys.stderr.buffer.write(forged)\n"
        "sys.exit(1)\n"
    ),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_check_script_attacked_by_the_code_it_runs_is_an_assessable_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], attack: str
) -> None:
    task = check_task(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "run.py").write_text(ATTACKS[attack])
    assert evaluate(["--task", str(task), "--workspace", str(ws), "--json"]) == 0
    graded = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert graded["assessable"] is True, graded
    assert graded["score"] == 0.0, graded


REACH_THE_CHECK = """
import os, signal
check = os.getppid()
reached = []
for path in (f"/proc/{check}/environ", f"/proc/{check}/mem", f"/proc/{check}/fd/1"):
    try:
        with open(path, "rb") as f:
            f.read(1)
        reached.append(path)
    except OSError:
        pass
for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGKILL):
    for pid in [check] + [int(d) for d in os.listdir("/proc") if d.isdigit()]:
        if pid != os.getpid():
            try:
                os.kill(pid, sig)
            except OSError:
                pass
print(42 if not reached else "reached " + " ".join(reached))
"""
"""Right answer, hostile: reads its check's environment (where the check's text came), memory and
stdout, then stops, terminates and kills it (was: the check killed, every verdict failed)."""


def test_the_code_a_check_runs_can_neither_read_nor_signal_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    task = check_task(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "run.py").write_text(REACH_THE_CHECK)
    assert evaluate(["--task", str(task), "--workspace", str(ws), "--json"]) == 0
    graded = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # Both verdicts came from a check that ran to its end and read 42: nothing reached it.
    assert (graded["assessable"], graded["score"]) == (True, 1.0), graded


def test_the_check_still_grades_honest_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    task = check_task(tmp_path)
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "run.py").write_text("print(42)\n")
    assert evaluate(["--task", str(task), "--workspace", str(ws), "--json"]) == 0
    graded = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (graded["assessable"], graded["score"]) == (True, 1.0), graded


@pytest.mark.asyncio(loop_scope="session")
async def test_a_harness_log_is_bounded_and_its_end_is_read_without_the_rest() -> None:
    """The keeper keeps LOG_LIMIT bytes and the last 64 KiB of the harness's output; the runner
    reads only the end (the issue: two 512 MB logs read whole stalled the runner's loop)."""
    host = SandboxHost(REPO / ".gyre" / "test-proof" / uuid.uuid4().hex[:8], uid_base=61250, uid_count=50)
    box = await host.create("flood", SandboxLimits(memory_mb=512, max_procs=32, file_size_mb=64, disk_mb=96))
    try:
        flood = (
            "import sys\nfor _ in range(24):\n    sys.stdout.write('x' * (1 << 20))\nprint('\\nTHE END')\n"
        )
        await box.launch([sys.executable, "-c", flood], env={})
        outcome = await box.wait(timeout_s=60)
        assert (outcome.started, outcome.exit_code) == (True, 0)
        size = (box.path / "log" / "harness.log").stat().st_size
        assert LOG_LIMIT < size <= LOG_LIMIT + Drain.TAIL + 200, size
        tail = await box.log_tail(100)
        assert len(tail) == 100 and tail.rstrip().endswith("THE END")
    finally:
        await box.release()
        host.sweep()
        host.root.rmdir()


@pytest.mark.asyncio(loop_scope="session")
async def test_a_harness_that_fills_its_disk_still_has_its_end_recorded() -> None:
    """The keeper's records share the sandbox's quota: it reserves their room before the harness
    runs, so a full disk cannot leave an execution without its outcome (a reattached runner
    would call that `keeper_lost`: an infrastructure failure)."""
    host = SandboxHost(REPO / ".gyre" / "test-proof" / uuid.uuid4().hex[:8], uid_base=61300, uid_count=50)
    if not host.isolation.tmpfs_quota:
        pytest.skip("no tmpfs quota on this host: the disk limit is a watcher's kill instead")
    box = await host.create("fill", LIMITS)
    try:
        fill = (  # files of 1 MiB (the file size limit is lower than the quota) until ENOSPC
            "import errno, os, sys\nn = 0\nwhile True:\n    n += 1\n"
            "    try:\n        with open(os.path.join(os.environ['HOME'], f'fill{n}'), 'wb') as f:\n"
            "            f.write(b'x' * (1 << 20))\n"
            "    except OSError as e:\n        if e.errno == errno.ENOSPC:\n            break\n"
            "        raise\n"
            "sys.exit(3)\n"
        )
        await box.launch([sys.executable, "-c", fill], env={})
        outcome = await box.wait(timeout_s=60)
        assert (outcome.started, outcome.exit_code, outcome.killed) == (True, 3, "")
        assert json.loads((box.path / "log" / "outcome.json").read_text())["exit_code"] == 3
    finally:
        await box.release()
        host.sweep()
        host.root.rmdir()
