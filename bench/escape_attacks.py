"""The escape corpus: attacks as code run inside a sandbox, and how the host judges each.

Each attack prints what it managed and never decides containment itself; `judge` looks from the
host's side wherever it can (did the file appear, did the listener get a connection, is the
canary alive, is a shared-memory segment left, how many connections reached the proxy).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import site
import socket
import textwrap
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gyre.sandbox.limits import MIB, SandboxLimits
from services.evaluator.taskset import BUNDLED

LIMITS = SandboxLimits(
    cpu_s=20, memory_mb=256, max_procs=32, file_size_mb=8, disk_mb=32, cpus=0.5, max_connections=16
)
DEADLINE_S = 6.0
PROJECT = Path(__file__).resolve().parents[1]


@dataclass
class Targets:
    secret_file: Path
    secret: str
    outside: list[Path]
    listener_port: int
    canary_pid: int
    site_dirs: list[str] = field(default_factory=list)
    """Where a planted .pth or sitecustomize.py would run in every later Python (the grader's too)."""
    hidden: dict[str, str] = field(default_factory=dict)
    """Bundled hidden test files -> their digest before the attacks."""
    project: str = str(PROJECT)
    """The checkout: its .git holds the hidden tests (`git show`)."""
    other_secret_file: str = ""
    """A file in another live sandbox's workspace; reading it is an escape."""
    other_secret: str = ""
    shm_key: int = 0
    """SysV shared memory key an attack creates; a segment left on the host is an escape."""
    forward_port: int = 18080
    """The proxy port as a sandbox sees it (the `connections` attack floods it)."""


def attack_code(name: str, t: Targets) -> str:
    """Python run inside the sandbox; prints what it managed, never decides containment itself."""
    outs = [str(p) for p in t.outside]
    code = {
        "read_outside": f"""
            for p in [{str(t.secret_file)!r}, "/etc/shadow", "/root/.bashrc"]:
                try:
                    print("READ", p, open(p).read()[:200])
                except Exception as e:
                    print("denied", p, e)
        """,
        "write_outside": f"""
            for p in {outs!r}:
                try:
                    open(p, "w").write("escaped")
                    print("WROTE", p)
                except Exception as e:
                    print("denied", p, e)
        """,
        "network": f"""
            import socket
            for host, port in [("127.0.0.1", {t.listener_port}), ("10.0.0.1", 80), ("1.1.1.1", 53)]:
                try:
                    socket.create_connection((host, port), timeout=2).close()
                    print("CONNECTED", host, port)
                except Exception as e:
                    print("refused", host, port, e)
        """,
        "tamper_grader": f"""
            for d in {t.site_dirs!r}:
                for name, text in (("gyre_forge.pth", "import os\\n"), ("sitecustomize.py", "x = 1\\n")):
                    try:
                        open(d + "/" + name, "a").write(text)
                        print("WROTE", d, name)
                    except Exception as e:
                        print("denied", d, name, e)
            for f in {sorted(t.hidden)!r}:
                try:
                    print("READ", f, open(f).read()[:40])
                    open(f, "a").write("\\ndef test_forged():\\n    pass\\n")
                    print("EDITED", f)
                except Exception as e:
                    print("denied", f, e)
        """,
        "fork_bomb": """
            import os, time
            n = 0
            try:
                for _ in range(10000):
                    if os.fork() == 0:
                        time.sleep(30)
                        os._exit(0)
                    n += 1
            except OSError as e:
                print("fork stopped at", n, e)
            print("FORKED", n)
            time.sleep(30)
        """,
        "memory": """
            import os, time
            try:
                b = bytearray(1024 * 1024 * 1024)
                print("ALLOC1G")
            except MemoryError:
                print("1 GiB refused")
            kids = []
            for i in range(3):
                pid = os.fork()
                if pid == 0:
                    try:
                        blob = b"x" * (200 * 1024 * 1024)
                        print("HELD200", i, flush=True)
                        time.sleep(3)
                    except MemoryError:
                        print("refused200", i, flush=True)
                    os._exit(0)
                kids.append(pid)
            for k in kids:
                os.waitpid(k, 0)
        """,
        "fill_disk": """
            import os
            total = 0
            try:
                for i in range(200):
                    with open(f"fill-{i}.bin", "wb") as f:
                        for _ in range(4):
                            f.write(b"\\0" * 1024 * 1024)
                            total += 1024 * 1024
            except OSError as e:
                print("stopped", e)
            print("WROTE_MB", total // (1024 * 1024))
        """,
        "outlive_deadline": """
            import os, subprocess, time
            subprocess.Popen(["sleep", "300"], start_new_session=True)
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    time.sleep(300)
                os._exit(0)
            time.sleep(300)
        """,
        "unix_sockets": """
            import os, socket, subprocess
            r = subprocess.run(["psql", "-h", "/var/run/postgresql", "-U", "postgres", "-c", "select 1"],
                               capture_output=True, text=True, timeout=10)
            print("PSQL_OK" if r.returncode == 0 else "psql refused", r.stderr[:120])
            for top in ("/run", "/var/run", "/tmp", "/var/lib"):
                for d, _, files in os.walk(top):
                    for n in files:
                        p = os.path.join(d, n)
                        try:
                            s = socket.socket(socket.AF_UNIX)
                            s.settimeout(1)
                            s.connect(p)
                            print("CONNECTED", p)
                        except OSError:
                            pass
        """,
        "hidden_tests": f"""
            import subprocess
            r = subprocess.run(["git", "-C", {t.project!r}, "show",
                                "HEAD:services/evaluator/tasks/slugfix/hidden/test_fail_to_pass.py"],
                               capture_output=True, text=True, timeout=10)
            print("GITSHOW" if r.returncode == 0 and "slugify" in r.stdout else "git refused", r.stderr[:100])
            for f in {sorted(t.hidden)!r}:
                try:
                    print("READ", f, open(f).read()[:40])
                except Exception as e:
                    print("denied", f, e)
            for line in open("/proc/self/mountinfo"):
                for path in line.split()[3:5]:
                    if "grader" in path or "hidden" in path:
                        try:
                            print("READ", path, open(path).read()[:40])
                        except Exception as e:
                            print("denied", path, e)
        """,
        "other_workspace": f"""
            for p in [{t.other_secret_file!r}]:
                try:
                    print("READ", p, open(p).read()[:200])
                except Exception as e:
                    print("denied", p, e)
        """,
        "sysv_shm": f"""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            print("shmget", libc.shmget({t.shm_key}, 64 << 20, 0o1666))
        """,
        "cpu": """
            import os, time
            start = time.monotonic()
            kids = []
            for _ in range(4):
                pid = os.fork()
                if pid == 0:
                    end = time.monotonic() + 3
                    while time.monotonic() < end:
                        pass
                    os._exit(0)
                kids.append(pid)
            for k in kids:
                os.waitpid(k, 0)
            t = os.times()
            print("CPU", t.children_user + t.children_system, "WALL", time.monotonic() - start)
        """,
        "connections": f"""
            import socket, time
            conns = []
            for _ in range(3600):
                try:
                    conns.append(socket.create_connection(("127.0.0.1", {t.forward_port}), timeout=1))
                except OSError:
                    break
            print("OPENED", len(conns))
            time.sleep(1)
        """,
        "privileges": """
            import subprocess
            status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
            print("NNP", status["NoNewPrivs"].strip(), "SECCOMP", status["Seccomp"].strip())
            r = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True)
            print("USERNS_OK" if r.returncode == 0 else "userns refused")
        """,
        "signal_others": f"""
            import os, signal
            for pid in [{t.canary_pid}, 1, -1]:
                try:
                    os.kill(pid, signal.SIGKILL)
                    print("SIGNALLED", pid)
                except Exception as e:
                    print("denied", pid, e)
        """,
    }[name]
    return textwrap.dedent(code)


ATTACKS = (
    "read_outside", "write_outside", "network", "fork_bomb", "memory", "fill_disk", "outlive_deadline",
    "signal_others", "tamper_grader", "unix_sockets", "hidden_tests", "other_workspace", "sysv_shm", "cpu",
    "connections", "privileges",
)  # fmt: skip
"""The nine attacks of the first corpus, then those of issue 16 (host sockets, hidden tests
through git and mountinfo, another workspace, SysV shared memory, CPU, proxy connections,
privileges)."""


def uid_processes(uid: int | None) -> int:
    """Live processes of `uid` on the host (a zombie runs no code and holds nothing but its pid)."""
    if uid is None:
        return 0
    n = 0
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                status = (d / "status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if int(fields.get("Uid", "-1 0").split()[0]) == uid and not fields.get(
                "State", ""
            ).strip().startswith("Z"):
                n += 1
    return n


def judge(
    name: str, output: str, t: Targets, *, leftover: int, used_bytes: int, listener_hits: int, peak: int = 0
) -> tuple[bool, str]:
    """Contained or not, judged from the host's side where it can be (files, listeners, segments)."""
    if name == "read_outside":
        return t.secret not in output and "READ /etc/shadow" not in output, "secret not read"
    if name == "write_outside":
        written = [str(p) for p in t.outside if p.exists()]
        return not written, f"written: {written}" if written else "nothing written outside"
    if name == "network":
        ok = listener_hits == 0 and "CONNECTED" not in output
        return ok, f"listener hits {listener_hits}"
    if name == "fork_bomb":
        forked = [
            int(w) for line in output.splitlines() if line.startswith("FORKED") for w in line.split()[1:2]
        ]
        n = forked[0] if forked else 0
        return (
            n <= LIMITS.max_procs and leftover == 0,
            f"forked {n} (limit {LIMITS.max_procs}), left {leftover}",
        )
    if name == "memory":
        held = output.count("HELD200")
        ok = "ALLOC1G" not in output and held * 200 < LIMITS.memory_mb * 2
        return ok, f"1 GiB refused, {held} x 200 MiB held at once at most"
    if name == "fill_disk":
        ok = used_bytes <= (LIMITS.disk_mb + 1) * MIB
        return ok, f"sandbox holds {used_bytes // MIB} MiB (quota {LIMITS.disk_mb})"
    if name == "outlive_deadline":
        return leftover == 0, f"{leftover} processes left after the deadline"
    if name == "tamper_grader":
        planted = [
            d for d in t.site_dirs for n in ("gyre_forge.pth", "sitecustomize.py") if Path(d, n).exists()
        ]
        edited = [f for f, digest in t.hidden.items() if _digest(Path(f)) != digest]
        read = "READ " in output
        ok = not planted and not edited and not read
        return ok, f"planted {planted}, edited {edited}, hidden tests read: {read}"
    if name == "unix_sockets":
        ok = "PSQL_OK" not in output and "CONNECTED" not in output
        return ok, "no host socket reached" if ok else "a host Unix socket answered"
    if name == "hidden_tests":
        ok = "GITSHOW" not in output and "READ " not in output
        return ok, "hidden tests unreadable" if ok else "hidden tests read"
    if name == "other_workspace":
        ok = t.other_secret not in output
        return ok, "other workspace unreadable" if ok else "other workspace read"
    if name == "sysv_shm":
        left = shm_exists(t.shm_key)
        return not left, "no segment left on the host" if not left else "a segment outlived the sandbox"
    if name == "cpu":
        nums = output.split()
        try:
            cpu, wall = float(nums[nums.index("CPU") + 1]), float(nums[nums.index("WALL") + 1])
        except (ValueError, IndexError):
            return True, "the attack was stopped before it measured"
        ratio = cpu / max(wall, 1e-6)
        return ratio <= LIMITS.cpus * 1.2, f"{ratio:.2f} CPUs used (limit {LIMITS.cpus})"
    if name == "connections":
        ok = peak <= LIMITS.max_connections
        return ok, f"{peak} open at once through the forwarder (limit {LIMITS.max_connections})"
    if name == "privileges":
        ok = "NNP 0" not in output and "SECCOMP 0" not in output and "USERNS_OK" not in output
        return ok, "no_new_privs, seccomp, no user namespace" if ok else output.strip()[:80]
    if name == "signal_others":
        canary_alive = alive(t.canary_pid)
        return canary_alive and "SIGNALLED " + str(
            t.canary_pid
        ) not in output, "canary alive" if canary_alive else "canary killed"
    raise AssertionError(name)


def grader_targets() -> dict[str, Any]:
    """Site folders of the Python that runs graders, and the bundled hidden tests' digests."""
    return {
        "site_dirs": sorted({p for p in site.getsitepackages() if os.path.isdir(p)}),
        "hidden": {str(f): _digest(f) for f in sorted(BUNDLED.glob("*/hidden/*"))},
    }


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class Listener:
    """A host TCP port that is not the proxy: any connection to it is an escape."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.hits = 0
        self.stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
                self.hits += 1
                conn.close()
            except OSError:
                continue


def shm_exists(key: int) -> bool:
    """Whether a SysV segment with `key` is in the host's IPC namespace (removed if so)."""
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(key, 0, 0)
    if shmid >= 0:
        libc.shmctl(shmid, 0, None)  # IPC_RMID: leave nothing behind
    return shmid >= 0
