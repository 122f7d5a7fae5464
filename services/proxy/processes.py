"""Process 0 of a multi-process proxy starts the others and keeps them (shell: subprocesses).

The others are `python -m services.proxy` again, told their index, the shared HTTP port, every
process's private URL and the peers' secret through the environment. Process 0 waits until each
answers on its private port before it serves; a process that exits later takes process 0 down
with it (a worker of its `ServiceHost` raising), so whatever restarts the proxy (`gyre up`'s
supervisor) restarts all of them and no execution is left pinned to a process that is gone.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import sys
import time

import aiohttp
import structlog
from pydantic_settings import BaseSettings

from gyre.settings import KernelSettings
from services.proxy.config import ProxySettings
from services.proxy.pinning import Peers

log = structlog.get_logger(__name__)
START_TIMEOUT_S = 120.0


def plan_peers(host: str, processes: int) -> Peers:
    """Process 0's view: a free private port for every process and a fresh secret."""
    ports = []
    holders = []
    for _ in range(processes):  # held open together, so the ports differ
        s = socket.socket()
        s.bind((host, 0))
        holders.append(s)
        ports.append(s.getsockname()[1])
    for s in holders:
        s.close()
    return Peers(index=0, urls=tuple(f"http://{host}:{p}" for p in ports), secret=secrets.token_hex(16))


def shared_socket(host: str, port: int) -> socket.socket:
    """The API port every proxy process binds (SO_REUSEPORT), bound but not listening yet: the
    kernel hands connections only to the processes listening on it."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.setblocking(False)
    return sock


def settings_env(settings: BaseSettings) -> dict[str, str]:
    """`settings` as the environment that reads them back (its prefix, names upper-cased)."""
    prefix = str(settings.model_config.get("env_prefix", ""))
    out = {}
    for name, value in settings.model_dump().items():
        if value is not None:
            out[f"{prefix}{name}".upper()] = str(value)
    return out


def peer_env(
    peers: Peers, index: int, http_port: int, *, settings: ProxySettings, kernel: KernelSettings
) -> dict[str, str]:
    """Process `index`'s environment: this process's settings as given (a caller may have built
    them in code, not from the environment), then its place among the peers."""
    env = {**os.environ, **settings_env(kernel), **settings_env(settings)}
    env.update(
        GYRE_PROXY_PROCESS_INDEX=str(index),
        GYRE_PROXY_HTTP_PORT=str(http_port),
        GYRE_PROXY_PEER_URLS=",".join(peers.urls),
        GYRE_PROXY_PEER_SECRET=peers.secret,
    )
    if kernel.metrics_port is not None:  # one metrics port per process: the others take free ones
        env["GYRE_METRICS_PORT"] = "0"
    return env


class Children:
    """Processes 1..N-1, started by process 0."""

    def __init__(
        self, peers: Peers, *, http_port: int, settings: ProxySettings, kernel: KernelSettings
    ) -> None:
        self.peers = peers
        self.http_port = http_port
        self.settings, self.kernel = settings, kernel
        self.procs: list[asyncio.subprocess.Process] = []

    async def start(self) -> None:
        for index in self.peers.others():
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "services.proxy",
                "--port",
                "0",
                env=peer_env(self.peers, index, self.http_port, settings=self.settings, kernel=self.kernel),
            )
            self.procs.append(proc)
        await self._wait_ready()
        log.info("proxy_processes_started", processes=self.peers.processes, pids=[p.pid for p in self.procs])

    async def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
            for index in self.peers.others():
                for _ in range(100_000):  # bounded by the deadline
                    if self.procs[index - 1].returncode is not None:
                        raise RuntimeError(f"proxy process {index} exited at start")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"proxy process {index} did not answer in {START_TIMEOUT_S:.0f} s")
                    try:
                        async with http.get(f"{self.peers.urls[index]}/health") as answer:
                            if answer.status == 200:
                                break
                    except (aiohttp.ClientError, TimeoutError):
                        pass
                    await asyncio.sleep(0.1)

    async def watch(self, stop: asyncio.Event) -> None:
        """Until `stop`; then stop them. One exiting first is an error that stops this process."""
        waits = {asyncio.ensure_future(p.wait()): p for p in self.procs}
        stopper = asyncio.ensure_future(stop.wait())
        try:
            done, _ = await asyncio.wait({stopper, *waits}, return_when=asyncio.FIRST_COMPLETED)
            if stopper not in done:
                gone = [waits[d].pid for d in done if d in waits]
                raise RuntimeError(f"proxy process(es) {gone} exited: stopping all of them")
        finally:
            stopper.cancel()
            await self.stop()
            for w in waits:
                w.cancel()

    async def stop(self, grace_s: float = 10.0) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                proc.terminate()
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()
