"""Pid 1 of a sandbox: private /proc and /tmp, a network of its own, the harness as the sandbox
user under rlimits, and a forwarder from 127.0.0.1:<port> to the proxy (shell).

`python -m gyre.sandbox.init` reads its spec (JSON) from stdin. The host starts it through
`unshare --pid --mount --fork --kill-child`, so it is pid 1 of a fresh pid namespace: when it
exits, or the host kills the `unshare` process, the kernel kills every process left in the
namespace, however it forked or detached. It keeps a descriptor of the host's network namespace
and enters it only to open the outbound half of a forwarded connection (`setns` is per thread;
this process has one thread), so nothing else inside can reach the host network.

Without namespaces (the fallback) it runs as a plain parent: no forwarder, no private mounts.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import faulthandler
import fcntl
import json
import os
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
from typing import Any

CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 8192, 16384, 1 << 18
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
PRIVATE_TMP_TARGETS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
POLL_S = 0.2
CHUNK = 65536

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _check(
        _libc.mount(
            source.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            flags,
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _private_mounts(private_tmp: str, *, hide: list[str], expose: list[str], stage: str) -> None:
    """A /proc of this pid namespace (no host processes to see), /tmp-like folders inside the
    quota, and empty folders over `hide` (e.g. /root) with the `expose` paths under them (the
    Python installation) mounted back read-only at the same place."""
    _mount("none", "/", None, MS_REC | MS_PRIVATE)
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    covers = [(t, True) for t in PRIVATE_TMP_TARGETS] + [(h, False) for h in hide]
    for n, (covered, is_tmp) in enumerate(c for c in covers if os.path.isdir(c[0])):
        # What must stay visible under the cover (the Python installation, the project's code when
        # it lives under /tmp or /root) is set aside first and moved back on top of it.
        keep = [e for e in expose if e.startswith(covered.rstrip("/") + "/") and os.path.isdir(e)]
        staged = []
        for k, path in enumerate(keep):
            point = os.path.join(stage, f"{n}-{k}")
            os.makedirs(point, exist_ok=True)
            _mount(path, point, None, MS_BIND | MS_REC)
            staged.append((point, path))
        if is_tmp:
            _mount(private_tmp, covered, None, MS_BIND | MS_REC)
        else:
            _mount("tmpfs", covered, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        for point, path in staged:
            os.makedirs(path, mode=0o755, exist_ok=True)
            _mount(point, path, None, MS_MOVE)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


class Forwarder:
    """127.0.0.1:<listen_port> inside the sandbox's network -> host:port in the host's network."""

    def __init__(self, *, listen_port: int, host: str, port: int, host_netns_fd: int, own_netns_fd: int):
        self.target = (host, port)
        self.host_netns_fd = host_netns_fd
        self.own_netns_fd = own_netns_fd
        self.listener = socket.create_server(("127.0.0.1", listen_port), backlog=64)
        self.listener.setblocking(False)
        self.peers: dict[socket.socket, socket.socket] = {}

    def register(self, sel: selectors.BaseSelector) -> None:
        sel.register(self.listener, selectors.EVENT_READ, self._accept)

    def _outbound(self) -> socket.socket:
        _check(_libc.setns(self.host_netns_fd, CLONE_NEWNET), "setns host")
        try:
            out = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            _check(_libc.setns(self.own_netns_fd, CLONE_NEWNET), "setns sandbox")
        out.settimeout(5.0)
        out.connect(self.target)
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
    namespaces = bool(spec.get("namespaces"))
    for procs in spec.get("cgroup_procs", []):  # "0" is the writer itself; children inherit it
        with open(procs, "w") as f:
            f.write("0")
    forwarder = None
    if namespaces:
        host_netns_fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        _private_mounts(spec["private_tmp"], hide=spec["hide"], expose=spec["expose"], stage=spec["stage"])
        _check(_libc.unshare(CLONE_NEWNET), "unshare net")
        own_netns_fd = os.open("/proc/self/ns/net", os.O_RDONLY)
        _loopback_up()
        if spec.get("forward"):
            fwd = spec["forward"]
            forwarder = Forwarder(
                listen_port=fwd["listen_port"],
                host=fwd["host"],
                port=fwd["port"],
                host_netns_fd=host_netns_fd,
                own_netns_fd=own_netns_fd,
            )
        else:
            os.close(host_netns_fd)
    log = open(spec["log_path"], "ab", buffering=0)
    uid = spec.get("uid")
    child = subprocess.Popen(
        spec["argv"],
        cwd=spec["cwd"],
        env=spec["env"],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        user=uid,
        group=spec.get("gid"),
        extra_groups=[] if uid is not None else None,
        start_new_session=namespaces,
        preexec_fn=_child_setup(spec["rlimits"]),
        close_fds=True,
        pass_fds=tuple(spec.get("pass_fds", ())),
    )
    for fd in spec.get("pass_fds", ()):  # only the harness keeps the write end: EOF when it is gone
        with contextlib.suppress(OSError):
            os.close(fd)
    sel = selectors.DefaultSelector()
    if forwarder is not None:
        forwarder.register(sel)
    code: int | None = None
    while code is None:
        for key, _ in sel.select(timeout=POLL_S):
            key.data(sel, key.fileobj)
        code = _reap(child.pid)
    if namespaces:  # pid 1: take everything else down with the harness
        with contextlib.suppress(ProcessLookupError):
            os.kill(-1, signal.SIGKILL)
        for _ in range(100_000):  # bounded; every process left got SIGKILL
            try:
                os.waitpid(-1, 0)
            except ChildProcessError:
                break
    return code


def _reap(main_pid: int) -> int | None:
    """Reap every exited child (pid 1 adopts orphans); the main child's exit code once it is gone."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return None
        if pid == 0:
            return None
        if pid == main_pid:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main() -> int:
    faulthandler.enable()
    spec = json.loads(sys.stdin.read())
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
    try:
        return run(spec)
    except OSError as exc:
        print(f"gyre-sandbox: setup failed: {exc}", file=sys.stderr)
        return 125 if exc.errno != errno.ENOENT else 127


if __name__ == "__main__":
    sys.exit(main())
