"""The sandbox's first process: the harness under rlimits, and a relay from 127.0.0.1:<port> to
the host's forwarder socket (shell).

Run as a plain script (`python -I -S init.py`, standard library only), reading its spec (JSON)
from stdin. Inside bubblewrap (`gyre.sandbox.rootfs`) it already runs as the sandbox user in
the sandbox's namespaces, as the namespace's pid 1 (`--as-pid-1`: no bwrap process of the
sandbox user sits inside): it sets the rlimits, relays the one forwarded port (the host side,
`gyre.sandbox.forward`, holds the only way out), starts the harness and reaps everything until
the harness exits, then kills what is left.

It makes itself non-dumpable first: a process of the same uid can then neither read nor write
its memory (`/proc/<pid>/mem`), open its descriptors (`/proc/<pid>/fd`, `pidfd_getfd`) nor read
its environment. Once the harness runs, it tells the keeper so on the status pipe (`status_fd`,
whose read end only the host holds) and closes it: `started`, or `failed <errno> <message>`
when set-up failed before. That line, not any log text, is the host's proof of whether set-up
finished (`gyre.sandbox.blame`). The harness's output goes to `log_fd`, a pipe the keeper
drains with a bound.

Without namespaces (the fallback, see `limits.plan_isolation`) it runs on the host as root: it
joins the cgroups, starts the harness as the sandbox user, and forwards nothing.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import json
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
from typing import Any

POLL_S = 0.2
CHUNK = 65536
PR_SET_DUMPABLE = 4


class Relay:
    """127.0.0.1:<listen_port> inside the sandbox -> the host's forwarder at `socket_path`."""

    def __init__(self, *, listen_port: int, socket_path: str):
        self.socket_path = socket_path
        self.listener = socket.create_server(("127.0.0.1", listen_port), backlog=64)
        self.listener.setblocking(False)
        self.peers: dict[socket.socket, socket.socket] = {}

    def register(self, sel: selectors.BaseSelector) -> None:
        sel.register(self.listener, selectors.EVENT_READ, self._accept)

    def _outbound(self) -> socket.socket:
        out = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        out.settimeout(5.0)
        out.connect(self.socket_path)
        out.setblocking(False)
        return out

    def _accept(self, sel: selectors.BaseSelector, _: socket.socket) -> None:
        try:
            inner, _addr = self.listener.accept()
        except BlockingIOError:
            return
        try:
            outer = self._outbound()
        except OSError as exc:
            print(f"gyre-sandbox: proxy unreachable: {exc}", file=sys.stderr)
            inner.close()
            return
        inner.setblocking(False)
        self.peers[inner], self.peers[outer] = outer, inner
        sel.register(inner, selectors.EVENT_READ, self._pump)
        sel.register(outer, selectors.EVENT_READ, self._pump)

    def _pump(self, sel: selectors.BaseSelector, src: socket.socket) -> None:
        dst = self.peers.get(src)
        if dst is None:
            return
        try:
            data = src.recv(CHUNK)
            if data:
                dst.setblocking(True)  # bounded: the peer is the proxy or the harness, both local
                dst.settimeout(30.0)
                dst.sendall(data)
                dst.setblocking(False)
                return
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(KeyError, ValueError):
                sel.unregister(s)
            self.peers.pop(s, None)
            s.close()


def _child_setup(rlimits: dict[str, list[int]]) -> Any:
    def setup() -> None:  # runs in the child after setuid, before exec; only syscalls here
        for name, (soft, hard) in rlimits.items():
            resource.setrlimit(getattr(resource, name), (soft, hard))

    return setup


def run(spec: dict[str, Any]) -> int:
    """`namespaces`: inside bwrap, already the sandbox user; otherwise root on the host (fallback)."""
    namespaces = bool(spec.get("namespaces"))
    for procs in spec.get("cgroup_procs", []):  # "0" is the writer itself; children inherit it
        with open(procs, "w") as f:
            f.write("0")
    relay = None
    if namespaces and spec.get("forward"):
        fwd = spec["forward"]
        relay = Relay(listen_port=fwd["listen_port"], socket_path=fwd["socket_path"])
    if namespaces and spec.get("as_first_process") and relay is None:
        _become(spec)  # does not return
    log = os.fdopen(spec["log_fd"], "ab", buffering=0)  # a pipe the keeper drains
    stdout_fd = spec.get("stdout_fd")  # a pipe the caller alone reads (a check's verdicts)
    uid = None if namespaces else spec.get("uid")
    child = subprocess.Popen(
        spec["argv"],
        cwd=spec["cwd"],
        env=spec["env"],
        stdin=subprocess.DEVNULL,
        stdout=log if stdout_fd is None else stdout_fd,
        stderr=log if stdout_fd is not None else subprocess.STDOUT,
        user=uid,
        group=spec.get("gid") if uid is not None else None,
        extra_groups=[] if uid is not None else None,
        start_new_session=namespaces,
        preexec_fn=_child_setup(spec["rlimits"]),
        close_fds=True,
        pass_fds=tuple(spec.get("pass_fds", ())),
    )
    _report(spec, b"started\n")  # from here on, whatever happens is the harness's doing
    log.close()
    for fd in [*spec.get("pass_fds", ()), *([stdout_fd] if stdout_fd is not None else [])]:
        # only the harness keeps the write ends: EOF when it is gone
        with contextlib.suppress(OSError):
            os.close(fd)
    sel = selectors.DefaultSelector()
    if relay is not None:
        relay.register(sel)
    code: int | None = None
    while code is None:
        for key, _ in sel.select(timeout=POLL_S):
            key.data(sel, key.fileobj)
        code = _reap(child.pid)
    if namespaces:  # everything else of the sandbox goes down with the harness
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
    return code


def _become(spec: dict[str, Any]) -> None:
    """Replace this process with the program (`as_first_process`, e.g. a check script): it is then
    the pid namespace's first process, which the kernel shields from the rest of the namespace.
    A signal its own processes send it is dropped unless it installed a handler for it, and
    SIGKILL and SIGSTOP always are, so the programs it starts can neither kill nor stop it; it
    reaps its own orphans, and its end takes every other process of the sandbox with it."""
    argv = spec["argv"]
    program = argv[0] if os.sep in argv[0] else _which(argv[0], spec["env"].get("PATH", os.defpath))
    if not os.access(program, os.X_OK):  # before `started`: a missing program is set-up's failure
        raise OSError(errno.ENOENT, f"cannot execute {program}")
    for name, (soft, hard) in spec["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    os.chdir(spec["cwd"])
    stdout_fd = spec.get("stdout_fd")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(stdout_fd if stdout_fd is not None else spec["log_fd"], 1)
    os.dup2(spec["log_fd"], 2)
    keep = {0, 1, 2, *spec.get("pass_fds", ())}
    _report(spec, b"started\n")  # from here on, whatever happens is the program's doing
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)
    for fd in keep - {0, 1, 2}:
        os.set_inheritable(fd, True)
    os.execve(program, argv, spec["env"])


def _which(name: str, path: str) -> str:
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return name


def _reap(main_pid: int) -> int | None:
    """Reap every exited child; the main child's exit code once it is gone."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid == 0:
            return None
        if pid == main_pid:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _report(spec: dict[str, Any], line: bytes) -> None:
    """Tell the keeper how set-up ended, once, and close the pipe: nothing else can write to it."""
    fd = spec.pop("status_fd", None)
    if fd is None:
        return
    try:
        os.write(fd, line[:4096])
    finally:
        os.close(fd)


def not_dumpable() -> None:
    """PR_SET_DUMPABLE 0: processes of the same uid lose ptrace-mode access to this one."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_DUMPABLE, 0): {os.strerror(err)}")


def main() -> int:
    faulthandler.enable()
    spec = json.loads(sys.stdin.read())
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    try:
        not_dumpable()
        return run(spec)
    except OSError as exc:
        print(f"gyre-sandbox: setup failed: {exc}", file=sys.stderr)
        _report(spec, f"failed {exc.errno or 0} {exc}\n".encode(errors="replace"))
        return 125 if exc.errno != errno.ENOENT else 127


if __name__ == "__main__":
    sys.exit(main())
