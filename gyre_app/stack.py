"""`gyre up` / `gyre down`: the whole system on one machine (shell).

With GYRE_NATS_URL / GYRE_DATABASE_URL unset, NATS and PostgreSQL come from the embedded wheels
(`embedded.py`) in the state folder; when set, those servers are used as they are. Every service
runs as its own detached process on a free port, and `stack.json` records what was started so
that `gyre down` stops exactly that and nothing else.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import asyncpg
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gyre.db.engine import libpq_url, with_database
from gyre.devstack.embedded import free_port, start_nats, start_postgres, stop_nats_in, stop_postgres
from gyre.devstack.processes import failure, is_our_process, read_json, spawn_detached, terminate, write_json
from gyre.sandbox.host import SHARED_TEMP
from gyre.settings import KernelSettings, stack_state_path
from gyre_app.migrations import upgrade_all
from gyre_app.register import register_engine as register_engine_at

REPO_ROOT = Path(__file__).resolve().parents[1]
# Start order. The engine comes first: on a fresh clone it writes the tiny model the proxy and
# the trainer load at start-up, so those two start once the engine serves.
SERVICES = ("engine", "scheduler", "trajectory", "runner", "evaluator", "proxy", "trainer")
NEEDS_MODEL = ("proxy", "trainer")
STACK_DATABASE = "gyre"
ENGINE_ID = "engine-0"
CELL_ID = "cell-0"
DEMO_GROUPS_PER_STEP = 1
"""The local stack trains after every group, so one submitted task shows a whole step."""
LOCAL_AGENT_ENV = {"GYRE_AGENT_MAX_TOKENS": "128", "GYRE_AGENT_MAX_TURNS": "4"}
"""The built-in agent's budget on the tiny random model, which never ends a reply by itself:
short replies and few turns keep an execution to seconds on a CPU."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceProcess:
    name: str
    pid: int
    address: str
    log_path: str
    metrics_url: str = ""
    """Its Prometheus endpoint when `gyre up --metrics` (or GYRE_METRICS_PORT) asked for one."""

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
    proxy_http_url: str = ""
    """Root of the proxy's OpenAI (`/v1`) and Anthropic (`/v1/messages`) APIs; empty without a proxy."""
    model_dir: str = ""
    """The checkpoint folder the engine serves and the trainer starts from."""

    def address_of(self, service: str) -> str:
        return next(s.address for s in self.services if s.name == service)


def load_state(state_dir: Path) -> StackState | None:
    raw = read_json(stack_state_path(state_dir))
    if raw is None:
        return None
    services = [ServiceProcess(**s) for s in raw.pop("services", [])]  # type: ignore[attr-defined]
    return StackState(services=services, **raw)  # type: ignore[arg-type]


def distinct_free_ports(count: int) -> list[int]:
    """`count` different free ports (free_port may hand out one twice when asked in a row)."""
    ports: list[int] = []
    for _ in range(count * 20):  # bounded
        if len(ports) == count:
            break
        port = free_port()
        if port not in ports:
            ports.append(port)
    if len(ports) != count:
        raise RuntimeError(f"could not find {count} distinct free ports")
    return ports


def sandboxes_dir(state_dir: Path) -> Path:
    """Where the runner's and the evaluator's sandboxes live for this stack.

    Sandboxes hide the shared temp folders inside them, so they cannot live there: a stack whose
    state folder is under /tmp (the tests') keeps them in the checkout's `.gyre/sandboxes/`, in a
    folder named after the state folder, so two stacks never sweep each other's.
    """
    if not any(state_dir.is_relative_to(t) for t in SHARED_TEMP):
        return state_dir / "sandboxes"
    tag = hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
    return REPO_ROOT / ".gyre" / "sandboxes" / f"{state_dir.name}-{tag}"


def service_env(name: str, *, state_dir: Path, ports: dict[str, int], proxy_http_port: int) -> dict[str, str]:
    """What each service is told about the others (its GYRE_<SERVICE>_* settings)."""
    model_dir = str(state_dir / "model")
    proxy_base_url = f"http://127.0.0.1:{proxy_http_port}"
    per_service = {
        "engine": {
            "GYRE_ENGINE_MODEL_DIR": model_dir,
            "GYRE_ENGINE_ENGINE_ID": ENGINE_ID,
            "GYRE_ENGINE_CELL_ID": CELL_ID,
        },
        "proxy": {"GYRE_PROXY_MODEL_DIR": model_dir, "GYRE_PROXY_HTTP_PORT": str(proxy_http_port)},
        "runner": {
            "GYRE_RUNNER_PROXY_ADDRESS": f"127.0.0.1:{ports['proxy']}" if "proxy" in ports else "",
            "GYRE_RUNNER_PROXY_BASE_URL": proxy_base_url,
            "GYRE_RUNNER_SANDBOX_ROOT": str(sandboxes_dir(state_dir) / "runner"),
            "GYRE_RUNNER_HARNESS_ENV": json.dumps(LOCAL_AGENT_ENV),
        },
        "evaluator": {"GYRE_EVALUATOR_SANDBOX_ROOT": str(sandboxes_dir(state_dir) / "evaluator")},
        "trainer": {
            "GYRE_TRAINER_MODEL_DIR": model_dir,
            "GYRE_TRAINER_STATE_DIR": str(state_dir / "trainer"),
            "GYRE_TRAINER_CELL_ID": CELL_ID,
            "GYRE_TRAINER_GROUPS_PER_STEP": str(DEMO_GROUPS_PER_STEP),
            "GYRE_TRAINER_TRAJECTORY_ADDRESS": (
                f"127.0.0.1:{ports['trajectory']}" if "trajectory" in ports else ""
            ),
        },
    }
    return per_service.get(name, {})


def up(
    kernel: KernelSettings,
    *,
    services: tuple[str, ...] = SERVICES,
    timeout_s: float = 120.0,
    metrics: bool = False,
) -> StackState:
    """Start (or find running) servers and services; returns what runs. Idempotent.

    With `metrics` (or GYRE_METRICS_PORT set) every service also serves Prometheus metrics on a
    port of its own, on 127.0.0.1, recorded as its `metrics_url`."""
    state_dir = kernel.state_dir.resolve()
    current = load_state(state_dir)
    if (
        current is not None
        and [s.name for s in current.services] == list(services)
        and all(is_our_process(s.pid, s.marker) for s in current.services)
    ):
        return current
    if current is not None:
        down(kernel)  # half a stack is worse than a clean restart
    state_dir.mkdir(parents=True, exist_ok=True)
    # Recorded before each start, so `gyre down` stops what did start even if a later start fails.
    partial = {"nats_url": "", "database_url": "", "embedded_nats": False, "embedded_postgres": False}
    if kernel.nats_url is None:
        write_json(stack_state_path(state_dir), {**partial, "embedded_nats": True})
    nats_url = kernel.nats_url or start_nats(state_dir / "nats").url
    database_url = kernel.database_url
    if database_url is None:
        write_json(
            stack_state_path(state_dir),
            {
                **partial,
                "nats_url": nats_url,
                "embedded_nats": kernel.nats_url is None,
                "embedded_postgres": True,
            },
        )
        database_url = ensure_database(start_postgres(state_dir / "postgres").url, STACK_DATABASE)
    upgrade_all(database_url)
    # Every port first, so each service can be told where the others will be.
    metrics = metrics or kernel.metrics_port is not None
    *service_ports, proxy_http_port = distinct_free_ports(len(services) * (2 if metrics else 1) + 1)
    ports = dict(zip(services, service_ports[: len(services)], strict=True))
    metrics_ports = dict(zip(services, service_ports[len(services) :], strict=False))
    state = StackState(
        nats_url=nats_url,
        database_url=database_url,
        embedded_nats=kernel.nats_url is None,
        embedded_postgres=kernel.database_url is None,
        proxy_http_url=f"http://127.0.0.1:{proxy_http_port}" if "proxy" in services else "",
        model_dir=str(state_dir / "model"),
    )
    env = kernel_env(nats_url, database_url, kernel.bus_prefix)
    (state_dir / "logs").mkdir(exist_ok=True)
    deadline = time.monotonic() + timeout_s

    def start(name: str) -> ServiceProcess:
        service = spawn_service(
            name,
            state_dir=state_dir,
            env=env,
            ports=ports,
            proxy_http_port=proxy_http_port,
            metrics_port=metrics_ports.get(name),
        )
        state.services.append(service)
        # Recorded at once, so `gyre down` can stop what started even if a later one fails.
        write_json(stack_state_path(state_dir), asdict(state))
        return service

    first = [start(name) for name in services if name not in NEEDS_MODEL]
    if "engine" in services:
        wait_serving(next(s for s in first if s.name == "engine"), deadline)
    for name in services:
        if name in NEEDS_MODEL:
            start(name)
    for service in state.services:
        wait_serving(service, deadline)
    if "proxy" in services and "engine" in services:
        register_engine(state)
    return state


def kernel_env(nats_url: str, database_url: str, bus_prefix: str) -> dict[str, str]:
    """This process's environment with the stack's servers and prefix, for every service."""
    return {
        **os.environ,
        "GYRE_NATS_URL": nats_url,
        "GYRE_DATABASE_URL": database_url,
        "GYRE_BUS_PREFIX": bus_prefix,
    }


def spawn_service(
    name: str,
    *,
    state_dir: Path,
    env: dict[str, str],
    ports: dict[str, int],
    proxy_http_port: int,
    metrics_port: int | None,
) -> ServiceProcess:
    """Start one service, detached, on its port, told where the others are."""
    log_path = state_dir / "logs" / f"{name}.log"
    argv = [sys.executable, "-m", f"services.{name}", "--port", str(ports[name])]
    metrics_env = {"GYRE_METRICS_PORT": str(metrics_port)} if metrics_port is not None else {}
    pid = spawn_detached(
        argv,
        log_path=log_path,
        cwd=REPO_ROOT,
        env={
            **env,
            **service_env(name, state_dir=state_dir, ports=ports, proxy_http_port=proxy_http_port),
            **metrics_env,
        },
    )
    return ServiceProcess(
        name=name,
        pid=pid,
        address=f"127.0.0.1:{ports[name]}",
        log_path=str(log_path),
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics" if metrics_port is not None else "",
    )


def restart(kernel: KernelSettings, name: str, *, timeout_s: float = 120.0) -> ServiceProcess:
    """Restart one service of a running stack in place: the same port and settings, nothing else
    touched (NATS, Postgres and the other services keep running, so executions carry on). A
    service that died is started again; one that runs is stopped first."""
    state_dir = kernel.state_dir.resolve()
    state = load_state(state_dir)
    if state is None:
        raise RuntimeError(f"no stack runs from {state_dir} (gyre up starts one)")
    old = next((s for s in state.services if s.name == name), None)
    if old is None:
        raise RuntimeError(f"the stack runs no {name!r}; it runs {', '.join(s.name for s in state.services)}")
    terminate(old.pid, old.marker, timeout_s=15.0)
    ports = {s.name: int(s.address.rsplit(":", 1)[1]) for s in state.services}
    metrics_port = int(old.metrics_url.split(":")[2].split("/")[0]) if old.metrics_url else None
    env = kernel_env(state.nats_url, state.database_url, kernel.bus_prefix)
    proxy_http_port = int(state.proxy_http_url.rsplit(":", 1)[1]) if state.proxy_http_url else 0
    service = spawn_service(
        name,
        state_dir=state_dir,
        env=env,
        ports=ports,
        proxy_http_port=proxy_http_port,
        metrics_port=metrics_port,
    )
    state.services[state.services.index(old)] = service
    write_json(stack_state_path(state_dir), asdict(state))
    wait_serving(service, time.monotonic() + timeout_s)
    return service


def register_engine(state: StackState) -> None:
    """Route the proxy to the local engine (see `gyre_app.register` for why `gyre up` does it)."""
    register_engine_at(
        state.address_of("proxy"), cell_id=CELL_ID, engine_id=ENGINE_ID, address=state.address_of("engine")
    )


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
    relocated = sandboxes_dir(state_dir)
    if not relocated.is_relative_to(state_dir):  # the stopped runner and evaluator released their sandboxes
        shutil.rmtree(relocated, ignore_errors=True)
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
