"""What a process in a sandbox can reach: the escapes of issue 16, each reproduced through the real
sandbox code (SandboxHost -> bwrap -> the sandbox's first process), judged from the host side.

One probe script runs once per module in a sandbox and reports what it managed; each test
checks one thing of it. Needs root (users, namespaces, mounts), as CI runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import socket
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from gyre.errors import InvalidArgument
from gyre.sandbox.host import Forward, Sandbox, SandboxHost
from gyre.sandbox.limits import Capabilities, SandboxLimits, plan_isolation
from gyre.sandbox.rootfs import RootPlan, bwrap_argv

pytestmark = pytest.mark.asyncio(loop_scope="session")
REPO = Path(__file__).resolve().parent.parent
HIDDEN = REPO / "services" / "evaluator" / "tasks" / "slugfix" / "hidden" / "test_fail_to_pass.py"
LIMITS = SandboxLimits(
    cpu_s=30, memory_mb=512, max_procs=32, file_size_mb=8, disk_mb=32, cpus=0.5, max_connections=4
)
SHM_KEY = 0x6779_7265  # "gyre"
IPC_CREAT, IPC_RMID = 0o1000, 0

PROBE = """
import ctypes, json, os, socket, subprocess, sys, time

def run(*argv):
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode
    except OSError as e:
        return f"{type(e).__name__}"

# Every socket under /, by scandir: a regular file or a folder is told by its directory entry,
# so only the rest is stat'ed (os.walk + a stat per file took ~20 s of the 0.5 CPU on CI).
sockets, folders = [], ["/"]
while folders:  # bounded: a folder symlink is not followed
    try:
        entries = list(os.scandir(folders.pop()))
    except OSError:
        continue
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                if entry.path not in ("/proc", "/sys", "/dev"):
                    folders.append(entry.path)
            elif not entry.is_file() and os.stat(entry.path).st_mode & 0o170000 == 0o140000:
                sockets.append(entry.path)
        except OSError:
            pass
libc = ctypes.CDLL(None, use_errno=True)
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
conns = []
for _ in range(12):
    try:
        conns.append(socket.create_connection(("127.0.0.1", FORWARD_PORT), timeout=2))
    except OSError:
        pass
report = {
    "paths": {p: os.path.exists(p) for p in ["/run", "/var/run", "/var/run/postgresql", "/home",
                                              "/root/.bashrc", "/etc/shadow", "HIDDEN", "OTHER"]},
    "unix_sockets": sockets,
    "psql": run("psql", "-h", "/var/run/postgresql", "-U", "postgres", "-c", "select 1"),
    "git_show": run("git", "-C", "REPO", "show", "HEAD:" + "HIDDEN".removeprefix("REPO/")),
    "no_new_privs": status["NoNewPrivs"].strip(),
    "seccomp": status["Seccomp"].strip(),
    "cap_eff": status["CapEff"].strip(),
    "unshare_user": run("unshare", "--user", "true"),
    "hostname": socket.gethostname(),
    "pids": sorted(int(d) for d in os.listdir("/proc") if d.isdigit()),
    "shm": libc.shmget(SHM_KEY, 1 << 20, 0o1666),
    "mountinfo": open("/proc/self/mountinfo").read(),
    "root_writable": os.access("/", os.W_OK),
    "connections_open": len(conns),
    "ptrace_traceme": libc.ptrace(0, 0, 0, 0),  # PTRACE_TRACEME: 0 where ptrace is allowed
}
print(json.dumps(report), flush=True)
time.sleep(1.5)  # hold the connections while the host counts them
"""


@dataclass
class Probed:
    report: dict[str, Any]
    other: Sandbox
    proxy_peak: int
    shm_after: int
    cpu_quota: str


class CountingServer:
    """Stands in for the proxy: counts connections open at once."""

    def __init__(self) -> None:
        self.open = 0
        self.peak = 0

    async def serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.open += 1
        self.peak = max(self.peak, self.open)
        await r.read()
        self.open -= 1
        w.close()


def _shm_exists(key: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(key, 0, 0)
    if shmid >= 0:
        libc.shmctl(shmid, IPC_RMID, None)
    return shmid


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def probed() -> AsyncIterator[Probed]:
    # Long enough that the forwarder's socket path passes the 107 bytes a Unix socket path may hold,
    # also where the root is relocated (a checkout under /tmp): the move keeps the last name.
    deep = REPO / ".gyre" / "test-root" / (("deep-" * 16) + uuid.uuid4().hex[:8])
    host = SandboxHost(deep, uid_base=61000, uid_count=100)
    counting = CountingServer()
    server = await asyncio.start_server(counting.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    other = await host.create("other", LIMITS)
    box = await host.create("probe", LIMITS)
    try:
        (other.work / "solution.py").write_text("secret = 1\n")
        other.own_files()
        script = box.home / "probe.py"
        code = (
            PROBE.replace("REPO", str(REPO)).replace("HIDDEN", str(HIDDEN)).replace("OTHER", str(other.work))
        )
        script.write_text(code.replace("SHM_KEY", str(SHM_KEY)).replace("FORWARD_PORT", "18080"))
        box.own_files()
        forward = Forward(host="127.0.0.1", port=port)
        await box.launch([sys.executable, "-u", str(script)], env={}, forward=forward)
        cpu = [d for d in box.cgroups if d.parent.name == "cpu"]
        cpu_quota = (cpu[0] / "cpu.cfs_quota_us").read_text().strip() if cpu else "no cpu cgroup"
        outcome = await box.wait(timeout_s=30)
        assert outcome.exit_code == 0, (
            box.path / "log" / "sandbox.log"
        ).read_text() + box.log_path.read_text()
        report = json.loads(box.log_path.read_text().strip().splitlines()[0])
        yield Probed(
            report=report,
            other=other,
            proxy_peak=counting.peak,
            shm_after=_shm_exists(SHM_KEY),
            cpu_quota=cpu_quota,
        )
    finally:
        server.close()
        await box.release()
        await other.release()
        host.sweep()
        host.root.rmdir()
        with contextlib.suppress(OSError):  # only if no other run is using it
            (REPO / ".gyre" / "test-root").rmdir()


async def test_no_host_unix_socket_is_reachable(probed: Probed) -> None:
    assert probed.report["unix_sockets"] == [], probed.report["unix_sockets"]
    assert probed.report["psql"] != 0


async def test_run_home_and_root_files_are_absent(probed: Probed) -> None:
    visible = {p for p, there in probed.report["paths"].items() if there}
    assert not visible, visible


async def test_the_project_checkout_and_its_hidden_tests_are_absent(probed: Probed) -> None:
    assert HIDDEN.is_file()  # on the host it is there
    assert probed.report["git_show"] != 0
    assert not probed.report["paths"][str(HIDDEN)]


async def test_another_sandbox_is_invisible(probed: Probed) -> None:
    assert (probed.other.work / "solution.py").is_file()
    assert not probed.report["paths"][str(probed.other.work)]
    assert str(probed.other.path) not in probed.report["mountinfo"]


async def test_sysv_shared_memory_dies_with_the_sandbox(probed: Probed) -> None:
    assert probed.report["shm"] >= 0, "the probe could create a segment in its own IPC namespace"
    assert probed.shm_after < 0, "the segment is not in the host's IPC namespace"


async def test_own_pid_and_uts_namespaces(probed: Probed) -> None:
    assert probed.report["hostname"] == "gyre-sandbox" != socket.gethostname()
    assert len(probed.report["pids"]) <= 6, probed.report["pids"]  # init (pid 1), python, kids


async def test_no_new_privs_seccomp_and_no_capabilities(probed: Probed) -> None:
    assert probed.report["no_new_privs"] == "1"
    assert probed.report["seccomp"] == "2"  # filter mode
    assert int(probed.report["cap_eff"], 16) == 0
    assert probed.report["unshare_user"] != 0
    assert not probed.report["root_writable"]


async def test_the_seccomp_filter_denies_ptrace(probed: Probed) -> None:
    assert probed.report["ptrace_traceme"] == -1


async def test_the_cpu_quota_is_set(probed: Probed) -> None:
    assert probed.cpu_quota == str(LIMITS.cfs_quota()[1])


async def test_connections_through_the_proxy_port_are_capped(probed: Probed) -> None:
    assert len(str(probed.other.path / "forward" / "proxy.sock")) > 107
    assert probed.report["connections_open"] >= LIMITS.max_connections
    assert 0 < probed.proxy_peak <= LIMITS.max_connections


async def test_the_root_plan_binds_nothing_of_run_var_home_root_or_sys() -> None:
    plan = RootPlan(
        bwrap="bwrap", etc=["hosts"], private_tmp="/s/tmp", cwd="/s/work", read_write=[("/s/work", "/s/work")]
    )
    argv = bwrap_argv(plan, ["true"])
    sources = {argv[i + 1] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")}
    assert not any(s.startswith(("/run", "/var", "/home", "/root", "/sys")) for s in sources), sources
    assert {"--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"} <= set(argv)


async def test_ipc_helper_sees_host_segments() -> None:
    """The host-side check above can see a segment when one exists (it is not blind)."""
    libc = ctypes.CDLL(None, use_errno=True)
    key = 0x6779_0001
    shmid = libc.shmget(key, 4096, IPC_CREAT | 0o600)
    assert shmid >= 0
    assert _shm_exists(key) == shmid


async def test_strict_mode_refuses_a_host_without_working_bwrap() -> None:
    caps = Capabilities(
        root=True, namespaces=False, tmpfs=True, cgroup_memory="m", cgroup_pids="p", cgroup_cpu="c"
    )
    with pytest.raises(InvalidArgument, match="namespaces: bwrap cannot start"):
        plan_isolation(caps, mode="strict")


async def test_bwrap_never_runs_as_root_when_it_cannot_drop_to_the_sandbox_user() -> None:
    caps = Capabilities(
        root=True, namespaces=True, bwrap="/x/bwrap", setpriv="", unshare="/usr/bin/unshare", tmpfs=True
    )
    assert plan_isolation(caps, mode="auto").namespaces is False


async def test_the_address_space_limit_can_exceed_the_memory_limit() -> None:
    """A harness runtime (Claude Code's Node) reserves far more address space than it touches."""
    limits = SandboxLimits(memory_mb=2048, address_space_mb=8192)
    assert limits.rlimits()["RLIMIT_AS"] == (8192 << 20, 8192 << 20)
    assert SandboxLimits(memory_mb=2048).rlimits()["RLIMIT_AS"] == (2048 << 20, 2048 << 20)
