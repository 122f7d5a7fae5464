"""`gyre up` / `gyre down`: the whole system on one machine (shell).

With GYRE_NATS_URL / GYRE_DATABASE_URL unset, NATS and PostgreSQL come from the embedded wheels
(`embedded.py`) in the state folder; when set, those servers are used as they are. Every service
runs as its own detached process on a free port, and `stack.json` records what was started so
that `gyre down` stops exactly that and nothing else (and sweeps the sandboxes a killed one left).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gyre.devstack.embedded import free_port, start_nats, start_postgres, stop_nats_in, stop_postgres
from gyre.devstack.processes import (
    failure,
    is_our_process,
    read_json,
    spawn_detached,
    terminate_all,
    write_json,
)
from gyre.sandbox.adopt import sweep_leftovers
from gyre.sandbox.roots import SHARED_TEMP
from gyre.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from gyre.settings import KernelSettings, stack_state_path
from gyre.tls import sync_channel
from gyre_app import secure as secure_stack
from gyre_app.migrations import upgrade_all
from gyre_app.stack_servers import ensure_database, servers_back

REPO_ROOT = Path(__file__).resolve().parents[1]
SETTINGS_PREFIX = "GYRE_"
"""Every setting of the kernel and the services is read from a variable named so."""
SERVICES = ("scheduler", "trajectory", "runner", "evaluator", "proxy", "trainer")
NEEDS_MODEL = ("proxy", "trainer")
STACK_DATABASE = "gyre"
CORE_CELL = "cell-0"
"""The trainer's cell: it holds the weights and the optimizer and always trains."""
DEFAULT_CELLS = 3
"""A core and two satellites: what a 2-core machine holds (each satellite runs an engine and
keeps a training worker warm)."""
MODES = ("colocate", "async", "gyre", "burst")
SATELLITE_SLOTS = 4
DEMO_GROUPS_PER_STEP = 1
"""The local stack trains after every group, so one submitted task shows a whole step."""
LOCAL_AGENT_ENV = {
    "GYRE_AGENT_MAX_TOKENS": "128",
    "GYRE_AGENT_MAX_TURNS": "4",
    "GYRE_HARNESS_MAX_OUTPUT_TOKENS": "128",
    "GYRE_HARNESS_MAX_TURNS": "4",
}
"""The harnesses' budget on the tiny random model, which never ends a reply by itself: short
replies and few turns keep an execution short on a CPU (the built-in agent's own variables, and
the ones Claude Code's and mini-swe-agent's adapters pass on)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceProcess:
    name: str
    pid: int
    address: str
    log_path: str
    module: str = ""
    """The service package it runs (`engine` for `engine-1`, `cell` for `cell-0`); empty: its name."""
    metrics_url: str = ""
    """Its Prometheus endpoint when `gyre up --metrics` (or GYRE_METRICS_PORT) asked for one."""
    settings_env: dict[str, str] = field(default_factory=dict)
    """The GYRE_* variables it was started with (its settings and the kernel's): `gyre restart`
    starts it again with these, never with the caller's shell (`stack_restart`)."""

    @property
    def marker(self) -> str:
        return f"services.{self.module or self.name}"


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
    """The checkpoint folder the engines serve and the trainer starts from."""
    mode: str = ""
    """The scheduling mode the scheduler started in."""
    tls: dict[str, str] = field(default_factory=dict)
    """`gyre up --secure`: the client certificate files the `gyre` command presents (gyre.tls);
    empty: the services talk plaintext."""

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
    folder named after the state folder, so two stacks never sweep each other's."""
    if not any(state_dir.is_relative_to(t) for t in SHARED_TEMP):
        return state_dir / "sandboxes"
    tag = hashlib.sha256(str(state_dir).encode()).hexdigest()[:12]
    return REPO_ROOT / ".gyre" / "sandboxes" / f"{state_dir.name}-{tag}"


def satellites(cells: int) -> list[str]:
    return [f"cell-{i}" for i in range(1, cells)]


def processes(cells: int) -> list[tuple[str, str]]:
    """(name, service package) of every process, in start order: one engine per satellite first
    (the first writes the tiny model on a fresh clone), the services, then one agent per cell."""
    engines = [(f"engine-{c}", "engine") for c in satellites(cells)]
    agents = [(c, "cell") for c in [CORE_CELL, *satellites(cells)]]
    return [*engines, *((s, s) for s in SERVICES), *agents]


def service_env(
    name: str, *, state_dir: Path, ports: dict[str, int], proxy_http_port: int, mode: str = "gyre"
) -> dict[str, str]:
    """What each process is told about the others (its GYRE_<SERVICE>_* settings)."""
    model_dir = str(state_dir / "model")
    proxy_base_url = f"http://127.0.0.1:{proxy_http_port}"

    def at(service: str) -> str:
        return f"127.0.0.1:{ports[service]}" if service in ports else ""

    if name.startswith("engine-"):
        cell = name.removeprefix("engine-")
        return {
            "GYRE_ENGINE_MODEL_DIR": model_dir,
            "GYRE_ENGINE_ENGINE_ID": name,
            "GYRE_ENGINE_CELL_ID": cell,
            "GYRE_ENGINE_NUM_THREADS": "1",
        }
    if name.startswith("cell-"):
        agent = {"GYRE_CELL_CELL_ID": name, "GYRE_CELL_SCHEDULER_ADDRESS": at("scheduler")}
        if name == CORE_CELL:
            return {**agent, "GYRE_CELL_CORE": "true", "GYRE_CELL_TRAINER_ADDRESS": at("trainer")}
        return {
            **agent,
            "GYRE_CELL_ENGINE_ADDRESS": at(f"engine-{name}"),
            "GYRE_CELL_SLOTS": str(SATELLITE_SLOTS),
        }
    per_service = {
        "scheduler": {
            "GYRE_SCHEDULER_PROXY_ADDRESS": at("proxy"),
            "GYRE_SCHEDULER_RUNNER_ADDRESS": at("runner"),
            "GYRE_SCHEDULER_MODE": mode,
            "GYRE_SCHEDULER_GROUPS_PER_STEP": str(DEMO_GROUPS_PER_STEP),
            "GYRE_SCHEDULER_MODEL_DIR": model_dir,
        },
        "proxy": {"GYRE_PROXY_MODEL_DIR": model_dir, "GYRE_PROXY_HTTP_PORT": str(proxy_http_port)},
        "runner": {
            "GYRE_RUNNER_PROXY_ADDRESS": at("proxy"),
            "GYRE_RUNNER_SCHEDULER_ADDRESS": at("scheduler"),
            "GYRE_RUNNER_PROXY_BASE_URL": proxy_base_url,
            "GYRE_RUNNER_SANDBOX_ROOT": str(sandboxes_dir(state_dir) / "runner"),
            "GYRE_RUNNER_HARNESS_ENV": json.dumps(LOCAL_AGENT_ENV),
        },
        "evaluator": {"GYRE_EVALUATOR_SANDBOX_ROOT": str(sandboxes_dir(state_dir) / "evaluator")},
        "trainer": {
            "GYRE_TRAINER_MODEL_DIR": model_dir,
            "GYRE_TRAINER_STATE_DIR": str(state_dir / "trainer"),
            "GYRE_TRAINER_CELL_ID": CORE_CELL,
            "GYRE_TRAINER_GROUPS_PER_STEP": str(DEMO_GROUPS_PER_STEP),
            "GYRE_TRAINER_STEPS_FROM_SCHEDULER": "true",
            "GYRE_TRAINER_TRAJECTORY_ADDRESS": at("trajectory"),
        },
    }
    return per_service.get(name, {})


def up(
    kernel: KernelSettings,
    *,
    cells: int = DEFAULT_CELLS,
    mode: str = "gyre",
    services: tuple[str, ...] = SERVICES,
    timeout_s: float = 180.0,
    metrics: bool = False,
    agent_env: dict[str, str] | None = None,
    supervise: bool = True,
    secure: bool = False,
    groups_per_step: int = DEMO_GROUPS_PER_STEP,
    proxy_processes: int = 1,
) -> StackState:
    """Start (or find running) servers, services and cells; returns what runs. Idempotent.

    `cells` counts the core cell; every other cell is a satellite with an engine and a warm
    training worker. The scheduler routes each satellite's engine as its agent registers and
    moves cells between rollout and training as `mode` decides. With `metrics` (or
    GYRE_METRICS_PORT set) every process also serves Prometheus metrics on a port of its own, on
    127.0.0.1, recorded as its `metrics_url`. `services` short of all of them starts those alone,
    without cells (tests of the stack's plumbing). `agent_env` adds to (or overrides) the built-in
    agent's settings (`LOCAL_AGENT_ENV`) for this start (a `restart` keeps them).
    `groups_per_step` is B for the scheduler and the trainer: a step as soon as B groups are in.
    A stack found running with some services dead gets those alone started again, in place; with
    `supervise` a detached supervisor (`gyre_app.supervise`) does that on its own from then on.
    With `secure`, gRPC between processes is mutual TLS and the embedded NATS and Postgres ask
    for passwords (`gyre_app.secure`); configured servers are used with the URLs given.
    """
    from gyre_app.supervise import revive, start_supervisor, supervisor_pid

    if cells < 2:
        raise ValueError(f"cells: at least 2 (a core and one satellite), got {cells}")
    if mode not in MODES:
        raise ValueError(f"mode: one of {', '.join(MODES)}, got {mode!r}")
    if groups_per_step < 1:
        raise ValueError(f"groups_per_step: at least 1, got {groups_per_step}")
    planned = processes(cells) if set(services) == set(SERVICES) else [(name, name) for name in services]
    state_dir = kernel.state_dir.resolve()
    secure = secure or (state_dir / "secure").is_dir()  # its Postgres and clients know no other way
    secure_stack.use_tls_env(secure_stack.process_tls_env(state_dir, secure_stack.CLIENT) if secure else {})
    current = load_state(state_dir)
    if (
        current is not None
        and [s.name for s in current.services] == [name for name, _ in planned]
        and current.mode == mode
        and bool(current.tls) == secure
        and servers_back(current, state_dir)
    ):
        revive(kernel)  # only what died; NATS, Postgres and the rest keep running
        if supervise and supervisor_pid(state_dir) is None:
            start_supervisor(
                kernel, kernel_env(current.nats_url, current.database_url, kernel.bus_prefix), REPO_ROOT
            )
        return load_state(state_dir) or current
    if current is not None:
        down(kernel)  # half a stack is worse than a clean restart
    state_dir.mkdir(parents=True, exist_ok=True)
    names = [name for name, _ in planned]
    keys = secure_stack.prepare(state_dir, names) if secure else None
    # Recorded before each start, so `gyre down` stops what did start even if a later start fails.
    partial = {"nats_url": "", "database_url": "", "embedded_nats": False, "embedded_postgres": False}
    if kernel.nats_url is None:
        write_json(stack_state_path(state_dir), {**partial, "embedded_nats": True})
    nats_auth = (keys.nats_user, keys.nats_password) if keys else None
    nats_url = kernel.nats_url or start_nats(state_dir / "nats", auth=nats_auth).url
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
        pg_password = keys.postgres_password if keys else None
        database_url = ensure_database(
            start_postgres(state_dir / "postgres", password=pg_password).url, STACK_DATABASE
        )
    upgrade_all(database_url)
    # Every port first, so each service can be told where the others will be.
    metrics = metrics or kernel.metrics_port is not None
    *service_ports, proxy_http_port = distinct_free_ports(len(names) * (2 if metrics else 1) + 1)
    ports = dict(zip(names, service_ports[: len(names)], strict=True))
    metrics_ports = dict(zip(names, service_ports[len(names) :], strict=False))
    modules = dict(planned)
    state = StackState(
        nats_url=nats_url,
        database_url=database_url,
        embedded_nats=kernel.nats_url is None,
        embedded_postgres=kernel.database_url is None,
        proxy_http_url=f"http://127.0.0.1:{proxy_http_port}",
        model_dir=str(state_dir / "model"),
        mode=mode,
        tls=keys.client_files() if keys else {},
    )
    env = kernel_env(nats_url, database_url, kernel.bus_prefix)
    (state_dir / "logs").mkdir(exist_ok=True)
    deadline = time.monotonic() + timeout_s

    def start(name: str) -> ServiceProcess:
        service = spawn_service(
            name,
            module=modules[name],
            state_dir=state_dir,
            env=env,
            ports=ports,
            proxy_http_port=proxy_http_port,
            metrics_port=metrics_ports.get(name),
            mode=mode,
            secure=secure,
            extra_env=(
                {"GYRE_RUNNER_HARNESS_ENV": json.dumps({**LOCAL_AGENT_ENV, **agent_env})}
                if agent_env and name == "runner"
                else {f"GYRE_{name.upper()}_GROUPS_PER_STEP": str(groups_per_step)}
                if name in ("scheduler", "trainer")
                else {"GYRE_PROXY_PROCESSES": str(proxy_processes)}
                if name == "proxy" and proxy_processes > 1
                else None
            ),
        )
        state.services.append(service)
        # Recorded at once, so `gyre down` can stop what started even if a later one fails.
        write_json(stack_state_path(state_dir), asdict(state))
        return service

    wait_serving(start(names[0]), deadline)  # the first engine writes the model the others load
    for name in names[1:]:
        if modules[name] != "cell":
            start(name)
    for service in state.services:
        wait_serving(service, deadline)
    agents = [start(name) for name in names if modules[name] == "cell"]
    for agent in agents:  # a satellite's agent serves once its training worker has imported torch
        wait_serving(agent, deadline)
    if agents:
        wait_cells_registered(state, cells, deadline)
    if supervise:
        start_supervisor(kernel, env, REPO_ROOT)
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
    module: str,
    mode: str,
    secure: bool = False,
    extra_env: dict[str, str] | None = None,
) -> ServiceProcess:
    """Start one service (or a cell agent: `module` names its package), detached, on its port,
    told where the others are."""
    log_path = state_dir / "logs" / f"{name}.log"
    argv = [sys.executable, "-m", f"services.{module}", "--port", str(ports[name])]
    metrics_env = {"GYRE_METRICS_PORT": str(metrics_port)} if metrics_port is not None else {}
    full_env = {
        **env,
        **service_env(name, state_dir=state_dir, ports=ports, proxy_http_port=proxy_http_port, mode=mode),
        **metrics_env,
        **(secure_stack.process_tls_env(state_dir, name) if secure else {}),
        **(extra_env or {}),
    }
    pid = spawn_detached(argv, log_path=log_path, cwd=REPO_ROOT, env=full_env)
    return ServiceProcess(
        name=name,
        pid=pid,
        address=f"127.0.0.1:{ports[name]}",
        log_path=str(log_path),
        module="" if module == name else module,
        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics" if metrics_port is not None else "",
        settings_env={k: v for k, v in full_env.items() if k.startswith(SETTINGS_PREFIX)},
    )


def wait_cells_registered(state: StackState, cells: int, deadline: float) -> None:
    """Until the scheduler knows every cell (each agent registers its own; the scheduler then
    routes the satellites' engines itself)."""
    with sync_channel(state.address_of("scheduler")) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        while time.monotonic() < deadline:
            known = stub.GetCells(scheduler_pb2.GetCellsRequest(), timeout=5.0).cells
            if sum(1 for c in known if c.role != scheduler_pb2.CELL_ROLE_LOST) == cells:
                return
            time.sleep(0.2)
    log_path = Path(state.services[-1].log_path)
    raise failure(f"the scheduler did not see all {cells} cells registered in time", log_path)


def wait_serving(service: ServiceProcess, deadline: float) -> None:
    """Poll the gRPC health service until SERVING; fail with the service's log if it dies or stalls."""
    with sync_channel(service.address) as channel:
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
    from gyre_app.supervise import stop_supervisor

    state_dir = kernel.state_dir.resolve()
    stop_supervisor(state_dir)  # first: it would start what is stopped below again
    state = load_state(state_dir)
    if state is None:
        return []
    # All at once: one by one, each service's own shutdown (a fetch to time out, the interpreter
    # to exit) added ~1-2 s, ~12 s for the eleven of a default stack.
    services = list(reversed(state.services))
    gone = terminate_all([(s.pid, s.marker) for s in services], timeout_s=timeout_s)
    stopped = [s.name for s, was_running in zip(services, gone, strict=True) if was_running]
    if state.embedded_nats and stop_nats_in(state_dir / "nats"):
        stopped.append("nats")
    if state.embedded_postgres and (state_dir / "postgres").exists():
        stop_postgres(state_dir / "postgres")
        stopped.append("postgres")
    stack_state_path(state_dir).unlink(missing_ok=True)
    sandboxes = sandboxes_dir(state_dir)
    for owner, uid_base in (("runner", 62000), ("evaluator", 63000)):  # the settings' uid defaults
        sweep_leftovers(sandboxes / owner, uid_base=uid_base)
    if not sandboxes.is_relative_to(state_dir):
        shutil.rmtree(sandboxes, ignore_errors=True)
    return stopped
