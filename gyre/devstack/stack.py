"""`gyre up` / `gyre down`: the whole system on one machine (shell).

With GYRE_NATS_URL / GYRE_DATABASE_URL unset, NATS and PostgreSQL come from the embedded wheels
(`embedded.py`) in the state folder; when set, those servers are used as they are. Every service
runs as its own detached process on a free port, and `stack.json` records what was started so
that `gyre down` stops exactly that and nothing else.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import asyncpg
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gyre.db.engine import libpq_url, with_database
from gyre.db.migrate import upgrade_all
from gyre.devstack.embedded import free_port, start_nats, start_postgres, stop_nats_in, stop_postgres
from gyre.devstack.processes import failure, is_our_process, read_json, spawn_detached, terminate, write_json
from gyre.settings import KernelSettings, stack_state_path

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("scheduler", "trajectory", "proxy", "engine", "runner", "evaluator", "trainer")
STACK_DATABASE = "gyre"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceProcess:
    name: str
    pid: int
    address: str
    log_path: str

    @property
    def marker(self) -> str:
        return f"services.{self.name}"


@dataclass(frozen=True, slots=True, kw_only=True)
class StackState:
    nats_url: str
    database_url: str
    embedded_nats: bool
    embedded_postgres: bool
    services: list[ServiceProcess] = field(default_factory=list)

    def address_of(self, service: str) -> str:
        return next(s.address for s in self.services if s.name == service)


def load_state(state_dir: Path) -> StackState | None:
    raw = read_json(stack_state_path(state_dir))
    if raw is None:
        return None
    services = [ServiceProcess(**s) for s in raw.pop("services", [])]  # type: ignore[attr-defined]
    return StackState(services=services, **raw)  # type: ignore[arg-type]


def up(
    kernel: KernelSettings, *, services: tuple[str, ...] = SERVICES, timeout_s: float = 60.0
) -> StackState:
    """Start (or find running) servers and services; returns what runs. Idempotent."""
    state_dir = kernel.state_dir.resolve()
    current = load_state(state_dir)
    if current is not None and all(is_our_process(s.pid, s.marker) for s in current.services):
        return current
    if current is not None:
        down(kernel)  # half a stack is worse than a clean restart
    state_dir.mkdir(parents=True, exist_ok=True)
    nats_url = kernel.nats_url or start_nats(state_dir / "nats").url
    database_url = kernel.database_url
    if database_url is None:
        database_url = ensure_database(start_postgres(state_dir / "postgres").url, STACK_DATABASE)
    upgrade_all(database_url)
    state = StackState(
        nats_url=nats_url,
        database_url=database_url,
        embedded_nats=kernel.nats_url is None,
        embedded_postgres=kernel.database_url is None,
    )
    env = {
        **os.environ,
        "GYRE_NATS_URL": nats_url,
        "GYRE_DATABASE_URL": database_url,
        "GYRE_BUS_PREFIX": kernel.bus_prefix,
    }
    (state_dir / "logs").mkdir(exist_ok=True)
    for name in services:
        port = free_port()
        log_path = state_dir / "logs" / f"{name}.log"
        argv = [sys.executable, "-m", f"services.{name}", "--port", str(port)]
        pid = spawn_detached(argv, log_path=log_path, cwd=REPO_ROOT, env=env)
        state.services.append(
            ServiceProcess(name=name, pid=pid, address=f"127.0.0.1:{port}", log_path=str(log_path))
        )
        # Recorded at once, so `gyre down` can stop what started even if a later one fails.
        write_json(stack_state_path(state_dir), asdict(state))
    deadline = time.monotonic() + timeout_s
    for service in state.services:
        wait_serving(service, deadline)
    return state


def wait_serving(service: ServiceProcess, deadline: float) -> None:
    """Poll the gRPC health service until SERVING; fail with the service's log if it dies or stalls."""
    with grpc.insecure_channel(service.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if not is_our_process(service.pid, service.marker):
                raise failure(
                    f"{service.name} (pid {service.pid}) exited during start-up", Path(service.log_path)
                )
            try:
                answer = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    raise failure(f"{service.name} was not serving on {service.address} in time", Path(service.log_path))


def down(kernel: KernelSettings, *, timeout_s: float = 15.0) -> list[str]:
    """Stop what `up` started, services first; returns the names stopped."""
    state_dir = kernel.state_dir.resolve()
    state = load_state(state_dir)
    if state is None:
        return []
    stopped = [s.name for s in reversed(state.services) if terminate(s.pid, s.marker, timeout_s=timeout_s)]
    if state.embedded_nats and stop_nats_in(state_dir / "nats"):
        stopped.append("nats")
    if state.embedded_postgres and (state_dir / "postgres").exists():
        stop_postgres(state_dir / "postgres")
        stopped.append("postgres")
    stack_state_path(state_dir).unlink(missing_ok=True)
    return stopped


def stop_embedded_servers(state_dir: Path) -> list[str]:
    """Stop the embedded servers the tests and benchmarks leave running under `state_dir`."""
    stopped = []
    for folder in sorted(p for p in state_dir.resolve().glob("*-servers") if p.is_dir()):
        if stop_nats_in(folder / "nats"):
            stopped.append(f"{folder.name}/nats")
        if (folder / "postgres" / "postmaster.pid").exists():
            stop_postgres(folder / "postgres")
            stopped.append(f"{folder.name}/postgres")
    return stopped


def ensure_database(server_url: str, name: str) -> str:
    """Create database `name` on the server if missing; return its URL."""

    async def create() -> None:
        conn = await asyncpg.connect(libpq_url(server_url))
        try:
            if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
                await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    return with_database(server_url, name)
