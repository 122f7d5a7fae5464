"""The sandbox's first process: the harness under rlimits, and a relay from 127.0.0.1:<port> to
the host's forwarder socket (shell).

Run as a plain script (`python -I -S init.py`, standard library only), reading its spec (JSON)
from stdin. Inside bubblewrap (`gyre.sandbox.rootfs`) it already runs as the sandbox user in
the sandbox's namespaces: it sets the rlimits, relays the one forwarded port (the host side,
`gyre.sandbox.forward`, holds the only way out), starts the harness and reaps everything until
the harness exits. bwrap's own pid 1 takes every process left in the pid namespace down with it.

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
    log = os.fdopen(spec["log_fd"], "ab", buffering=0)  # the host's harness.log
    uid = None if namespaces else spec.get("uid")
    child = subprocess.Popen(
        spec["argv"],
        cwd=spec["cwd"],
        env=spec["env"],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        user=uid,
        group=spec.get("gid") if uid is not None else None,
        extra_groups=[] if uid is not None else None,
        start_new_session=namespaces,
        preexec_fn=_child_setup(spec["rlimits"]),
        close_fds=True,
        pass_fds=tuple(spec.get("pass_fds", ())),
    )
    log.close()
    for fd in spec.get("pass_fds", ()):  # only the harness keeps the write end: EOF when it is gone
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
