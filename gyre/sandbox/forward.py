"""The host's half of a sandbox's one network path: a Unix socket to the proxy (shell: asyncio).

A sandbox has no network but its own loopback. Its first process listens on
127.0.0.1:<listen_port> inside and relays each connection to a Unix socket that this forwarder
serves from a folder mounted into the sandbox; the forwarder opens the TCP connection to the
proxy in the host's network. It never connects anywhere else, and it holds at most
`max_connections` open at once for one sandbox: past that a new connection is closed at once
(counted in `refused`), so a sandbox cannot exhaust the proxy's or the host's sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)
SOCKET_NAME = "proxy.sock"
CHUNK = 65536
CONNECT_TIMEOUT_S = 10.0


class Forwarder:
    def __init__(self, *, folder: Path, host: str, port: int, max_connections: int, uid: int | None):
        self.folder = folder
        self.target = (host, port)
        self.max_connections = max_connections
        self.uid = uid
        self.open = 0
        self.peak = 0
        """Most connections open at once (what the cap bounds)."""
        self.accepted = 0
        self.refused = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def socket_path(self) -> Path:
        return self.folder / SOCKET_NAME

    async def start(self) -> None:
        self.folder.mkdir(mode=0o711, exist_ok=True)
        # A Unix socket path holds at most 107 bytes and sandbox folders can be deeper: bind
        # through a descriptor of the folder (/proc/self/fd/N/...), which is always short.
        folder_fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            short = f"/proc/self/fd/{folder_fd}/{SOCKET_NAME}"
            self._server = await asyncio.start_unix_server(self._serve, path=short)
        finally:
            os.close(folder_fd)
        if self.uid is not None:  # only the sandbox user (and root) may connect
            os.chown(self.socket_path, self.uid, -1)
        os.chmod(self.socket_path, 0o600)

    async def _serve(self, inner_r: asyncio.StreamReader, inner_w: asyncio.StreamWriter) -> None:
        if self.open >= self.max_connections:
            self.refused += 1
            inner_w.close()
            return
        self.open += 1
        self.peak = max(self.peak, self.open)
        self.accepted += 1
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            try:
                outer_r, outer_w = await asyncio.wait_for(
                    asyncio.open_connection(*self.target), timeout=CONNECT_TIMEOUT_S
                )
            except (OSError, TimeoutError) as exc:
                log.warning("sandbox_proxy_unreachable", error=str(exc))
                inner_w.close()
                return
            try:
                await asyncio.gather(_pump(inner_r, outer_w), _pump(outer_r, inner_w))
            except asyncio.CancelledError:  # close(): the sandbox is gone; end quietly (a callback task)
                pass
            for w in (outer_w, inner_w):
                w.close()
        finally:
            self.open -= 1
            if task is not None:
                self._tasks.discard(task)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(OSError):
            self.socket_path.unlink()


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(CHUNK):
            dst.write(data)
            await dst.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if dst.can_write_eof():
                dst.write_eof()
            else:
                dst.close()
