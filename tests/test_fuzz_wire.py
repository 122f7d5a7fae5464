"""Every gRPC method of every service, fuzzed over the wire against the running service.

Each service runs in-process (its own event loop on a thread, real NATS and Postgres, a bus
prefix of its own) and hypothesis sends each of its methods requests built from the method's
descriptor (tests/wire_fuzz.py): wrong-looking values, missing fields, huge strings, odd
unicode, negative and extreme numbers, unknown enum values, replayed request ids, bodies that
are not protobuf and bodies cut short; client streams get truncated streams. For every request:
- the answer is OK or a clear refusal, never INTERNAL or UNKNOWN, and no error carries SQL or a
  traceback;
- a refused request leaves the service's tables as they were (nothing half-written);
and after each method's examples the service still answers its health check.

Bounded and repeatable in CI: EXAMPLES per method, derandomized. To hunt for more, run with
FUZZ_EXAMPLES=200 FUZZ_RANDOM=1 (fresh random examples each run).
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import given

from gyre.db.engine import libpq_url
from gyre.runtime import ServiceHost
from gyre.settings import KernelSettings
from tests.wire_fuzz import Answer, budget, call, leaks_internals, path_of, requests

T = TypeVar("T")
EXAMPLES = 10
REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    # A peer the service needs and the test does not run (the runner's proxy, say).
    grpc.StatusCode.UNAVAILABLE,
    # A call that waits (a stream of samples, a drain with a long timeout) past the test's wait.
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


@dataclass(slots=True)
class Running:
    host: ServiceHost
    loop: asyncio.AbstractEventLoop
    database_url: str
    schema: str

    def run(self, coro: Awaitable[T], timeout_s: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)  # type: ignore[arg-type]


def _serve(
    build: Callable[[KernelSettings], Awaitable[ServiceHost]], kernel: KernelSettings, schema: str
) -> Iterator[Running]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    own = kernel.model_copy(update={"bus_prefix": f"{kernel.bus_prefix}fz{uuid.uuid4().hex[:6]}"})
    assert own.database_url is not None
    running = Running(host=None, loop=loop, database_url=own.database_url, schema=schema)  # type: ignore[arg-type]
    running.host = running.run(build(own), timeout_s=120)
    running.run(running.host.start())
    try:
        yield running
    finally:
        running.run(running.host.stop(0.5))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


async def _row_counts(database_url: str, schema: str) -> dict[str, int]:
    conn = await asyncpg.connect(libpq_url(database_url))
    try:
        tables = [
            r[0] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)
        ]
        counts = {}
        for table in tables:
            if table in ("alembic_version",):
                continue
            counts[table] = await conn.fetchval(f'SELECT count(*) FROM "{schema}"."{table}"')
        return counts
    finally:
        await conn.close()


def _healthy(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def fuzz_service(running: Running, service: Any, *, skip: tuple[str, ...] = ()) -> None:
    """Fuzz every method of `service` (a ServiceDescriptor) on `running`, then check it serves."""
    address = running.host.address
    with grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 8 << 20)]) as channel:
        for method in service.methods:
            if method.name in skip:
                continue
            _fuzz_method(running, channel, method)
            assert _healthy(address), f"{service.name} stopped serving after {method.name}"


def _fuzz_method(running: Running, channel: grpc.Channel, method: Any) -> None:
    mutating = "request_id" in method.input_type.fields_by_name

    @budget(EXAMPLES)
    @given(bodies=requests(method))
    def check(bodies: list[bytes]) -> None:
        before = running.run(_row_counts(running.database_url, running.schema)) if mutating else None
        answer: Answer = call(channel, method, bodies, timeout_s=5)
        where = f"{path_of(method)} answered {answer.code.name}: {answer.details[:300]!r}"
        assert answer.code == grpc.StatusCode.OK or answer.code in REFUSALS, where
        assert not leaks_internals(answer.details), where
        if before is not None and answer.code != grpc.StatusCode.OK:
            after = running.run(_row_counts(running.database_url, running.schema))
            assert after == before, f"{where}, yet rows changed: {before} -> {after}"

    check()


REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from services.engine.model_init import init_model

    return init_model(tmp_path_factory.mktemp("fuzz-model"), seed=0)


def test_every_scheduler_method_refuses_bad_input_clearly(kernel: KernelSettings) -> None:
    from gyre.scheduler.v1 import scheduler_pb2
    from services.scheduler.config import SchedulerSettings
    from services.scheduler.main import build

    async def start(own: KernelSettings) -> ServiceHost:
        return await build(SchedulerSettings(port=0, admission="at_submit"), own)

    for running in _serve(start, kernel, "scheduler"):
        fuzz_service(running, scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"])


def test_every_trajectory_method_refuses_bad_input_clearly(kernel: KernelSettings) -> None:
    from gyre.trajectory.v1 import trajectory_pb2
    from services.trajectory.config import TrajectorySettings
    from services.trajectory.main import build

    async def start(own: KernelSettings) -> ServiceHost:
        return await build(TrajectorySettings(port=0), own)

    for running in _serve(start, kernel, "trajectory"):
        fuzz_service(running, trajectory_pb2.DESCRIPTOR.services_by_name["TrajectoryService"])


def test_every_proxy_method_refuses_bad_input_clearly(kernel: KernelSettings, tmp_path: Path) -> None:
    from gyre.proxy.v1 import proxy_pb2
    from services.proxy.config import ProxySettings
    from services.proxy.main import build
    from tests.proxy_support import write_tokenizer

    async def start(own: KernelSettings) -> ServiceHost:
        return await build(ProxySettings(model_dir=write_tokenizer(tmp_path / "tok")), own)

    for running in _serve(start, kernel, "proxy"):
        fuzz_service(running, proxy_pb2.DESCRIPTOR.services_by_name["ProxyService"])


def test_every_evaluator_and_runner_method_refuses_bad_input_clearly(kernel: KernelSettings) -> None:
    from gyre.evaluator.v1 import evaluator_pb2
    from gyre.runner.v1 import runner_pb2
    from gyre.sandbox.adopt import sweep_leftovers
    from services.evaluator.config import EvaluatorSettings
    from services.evaluator.main import build as build_evaluator
    from services.runner.config import RunnerSettings
    from services.runner.main import build as build_runner

    root = REPO / ".gyre" / "test-sandboxes" / f"fuzz-{uuid.uuid4().hex[:8]}"

    async def evaluator(own: KernelSettings) -> ServiceHost:
        return await build_evaluator(EvaluatorSettings(sandbox_root=root / "evaluator"), own)

    async def runner(own: KernelSettings) -> ServiceHost:
        settings = RunnerSettings(
            sandbox_root=root / "runner", proxy_address="127.0.0.1:1", proxy_base_url="http://127.0.0.1:1"
        )
        return await build_runner(settings, own)

    try:
        for running in _serve(evaluator, kernel, "evaluator"):
            fuzz_service(running, evaluator_pb2.DESCRIPTOR.services_by_name["EvaluatorService"])
        for running in _serve(runner, kernel, "runner"):
            fuzz_service(running, runner_pb2.DESCRIPTOR.services_by_name["RunnerService"])
    finally:  # a stopped runner leaves its sandboxes to the next one: sweep them, as `gyre down` does
        sweep_leftovers(root / "runner", uid_base=RunnerSettings.model_fields["uid_base"].default)


def test_every_engine_method_refuses_bad_input_clearly(kernel: KernelSettings, model_dir: Path) -> None:
    from gyre.engine.v1 import engine_pb2
    from services.engine.config import EngineSettings
    from services.engine.main import build

    async def start(own: KernelSettings) -> ServiceHost:
        settings = EngineSettings(
            model_dir=model_dir,
            engine_id="fuzz",
            cell_id="cell-fuzz",
            init_model_if_missing=False,
            publish_events=False,
            follow_weights=False,
            num_threads=1,
        )
        return await build(settings, own)

    for running in _serve(start, kernel, "engine"):
        fuzz_service(running, engine_pb2.DESCRIPTOR.services_by_name["EngineService"])


def test_every_trainer_method_refuses_bad_input_clearly(
    kernel: KernelSettings, model_dir: Path, tmp_path: Path
) -> None:
    from gyre.trainer.v1 import trainer_pb2
    from services.trainer.config import TrainerSettings
    from services.trainer.main import build

    async def start(own: KernelSettings) -> ServiceHost:
        settings = TrainerSettings(
            port=0, state_dir=tmp_path / "trainer", model_dir=model_dir, trajectory_address="127.0.0.1:1"
        )
        return await build(settings, own)

    for running in _serve(start, kernel, "trainer"):
        fuzz_service(running, trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"])


def test_every_cell_agent_method_refuses_bad_input_clearly(kernel: KernelSettings) -> None:
    """The core cell's agent (a satellite's also starts a training worker process, not fuzzed)."""
    from gyre.cell.v1 import cell_pb2
    from services.cell.config import CellSettings
    from services.cell.main import build

    async def start(own: KernelSettings) -> ServiceHost:
        settings = CellSettings(
            cell_id="cell-0", core=True, scheduler_address="127.0.0.1:1", trainer_address="127.0.0.1:1"
        )
        return await build(settings, own)

    for running in _serve(start, kernel, "cell"):
        fuzz_service(running, cell_pb2.DESCRIPTOR.services_by_name["CellService"])
