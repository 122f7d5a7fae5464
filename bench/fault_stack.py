"""The services the fault suite breaks, and the roles around them it plays itself (shell).

Real processes, each `python -m services.<name>` on fixed ports so a restart comes back where
its clients look: the proxy, the trajectory service and the trainer (tiny model). In this
process: a scripted engine behind the proxy (a fake at the engine boundary), and the parts of
the runner, scheduler and evaluator the accounting needs, played through their contracts: a
group's `TaskSubmitted`, execution tokens registered and revoked at the proxy (the revocation's
count of recorded calls), `RewardAssigned` carrying that count. Harnesses are HTTP clients of
the proxy's OpenAI API that retry a call cut by a fault, as real harnesses do.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import nats
from google.protobuf import message

from bench.scripted_engine import start_scripted_engine
from gyre.bus import Bus, BusConfig
from gyre.common.v1 import envelope_pb2, ids_pb2
from gyre.devstack.embedded import free_port
from gyre.evaluator.v1 import evaluator_pb2
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import new_event, stream_name
from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from gyre.rpc import GrpcServer
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2
from gyre.settings import KernelSettings
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre.trajectory.v1 import events_pb2 as trajectory_events
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc

SERVICES = ("proxy", "trajectory", "trainer")
RETRY_S = 0.3


@dataclass(slots=True)
class Service:
    name: str
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    ready: str
    """`http://...` polled for 200, or `host:port` of a gRPC server."""
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    async def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log_path}")
            if await self._answers():
                return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"{self.name} did not come up within {timeout_s} s; see {self.log_path}")

    async def _answers(self) -> bool:
        if self.ready.startswith("http"):
            try:
                async with aiohttp.ClientSession() as http, http.get(f"{self.ready}/health") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False
        try:
            async with grpc.aio.insecure_channel(self.ready) as channel:
                await asyncio.wait_for(channel.channel_ready(), timeout=1.0)
            return True
        except TimeoutError:
            return False


class Link:
    """A loopback link the suite can cut: 127.0.0.1:<port> relayed to `target` (the proxy reaches
    the engine through it). `cut` drops every open connection and refuses new ones until
    `restore`, as a broken network path would."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.up = True
        self.server: asyncio.AbstractServer | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.address = ""

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if not self.up:
            w.transport.abort()
            return
        try:
            out_r, out_w = await asyncio.open_connection(*self.target)
        except OSError:
            w.transport.abort()
            return
        self.writers |= {w, out_w}
        await asyncio.gather(self._pump(r, out_w), self._pump(out_r, w), return_exceptions=True)
        self.writers -= {w, out_w}

    @staticmethod
    async def _pump(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        finally:
            w.transport.abort()

    def cut(self) -> None:
        self.up = False
        for w in list(self.writers):
            w.transport.abort()  # a reset, as a broken path gives

    def restore(self) -> None:
        self.up = True

    async def close(self) -> None:
        self.cut()
        if self.server is not None:
            self.server.close()


@dataclass(slots=True, kw_only=True)
class Execution:
    execution_id: str
    task_id: str
    token: str
    answered: list[str] = field(default_factory=list)
    """Call ids whose whole answer the harness received."""
    num_recorded: int | None = None
    """The proxy's count, from revoking the token."""


class Stack:
    def __init__(self, kernel: KernelSettings, work: Path) -> None:
        self.kernel = kernel
        self.work = work
        self.services: dict[str, Service] = {}
        self.engine: GrpcServer | None = None
        self.link: Link | None = None
        self.bus: Bus | None = None
        self.proxy_url = ""
        self.proxy_address = ""
        self.trajectory_address = ""

    async def start(self) -> None:
        from services.engine.model_init import IM_END, init_model

        model_dir = self.work / "model"
        await asyncio.to_thread(init_model, model_dir)
        from transformers import AutoTokenizer

        tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        stop_id = int(tokenizer.convert_tokens_to_ids(IM_END))
        reply = [*tokenizer.encode(" All done here.", add_special_tokens=False), stop_id]
        self.engine, _ = await start_scripted_engine(
            lambda prompt: reply, engine_id="engine-1", cell_id="cell-1"
        )
        ports = {name: free_port() for name in (*SERVICES, "proxy_http")}
        self.proxy_url = f"http://127.0.0.1:{ports['proxy_http']}"
        self.proxy_address = f"127.0.0.1:{ports['proxy']}"
        self.trajectory_address = f"127.0.0.1:{ports['trajectory']}"
        common = {
            **os.environ,
            "GYRE_NATS_URL": str(self.kernel.nats_url),
            "GYRE_DATABASE_URL": str(self.kernel.database_url),
            "GYRE_BUS_PREFIX": self.kernel.bus_prefix,
            "GYRE_LOG_LEVEL": "warning",
        }
        envs: Mapping[str, dict[str, str]] = {
            "proxy": {
                "GYRE_PROXY_PORT": str(ports["proxy"]),
                "GYRE_PROXY_HTTP_PORT": str(ports["proxy_http"]),
                "GYRE_PROXY_MODEL_DIR": str(model_dir),
            },
            "trajectory": {"GYRE_TRAJECTORY_PORT": str(ports["trajectory"])},
            "trainer": {
                "GYRE_TRAINER_PORT": str(ports["trainer"]),
                "GYRE_TRAINER_TRAJECTORY_ADDRESS": self.trajectory_address,
                "GYRE_TRAINER_MODEL_DIR": str(model_dir),
                "GYRE_TRAINER_STATE_DIR": str(self.work / "trainer"),
                "GYRE_TRAINER_GROUPS_PER_STEP": "1",
                "GYRE_TRAINER_MAX_STALENESS_STEPS": "1000",
            },
        }
        ready = {
            "proxy": self.proxy_url,
            "trajectory": self.trajectory_address,
            "trainer": f"127.0.0.1:{ports['trainer']}",
        }
        for name in SERVICES:
            self.services[name] = Service(
                name=name,
                argv=[sys.executable, "-m", f"services.{name}"],
                env={**common, **envs[name]},
                log_path=self.work / f"{name}.log",
                ready=ready[name],
            )
            self.services[name].start()
        await asyncio.gather(*(s.wait_ready() for s in self.services.values()))
        assert self.kernel.nats_url
        self.bus = await Bus.connect(BusConfig(url=self.kernel.nats_url, prefix=self.kernel.bus_prefix))
        self.link = Link(self.engine.address)
        await self.link.start()
        async with grpc.aio.insecure_channel(self.proxy_address) as channel:
            await proxy_pb2_grpc.ProxyServiceStub(channel).RegisterEngine(  # type: ignore[misc]
                proxy_pb2.RegisterEngineRequest(
                    request_id="faults-engine",
                    cell_id="cell-1",
                    engine_id="engine-1",
                    address=self.link.address,
                )
            )

    async def restart(self, name: str) -> None:
        service = self.services[name]
        service.start()
        await service.wait_ready()

    async def close(self) -> None:
        for service in self.services.values():
            service.stop()
        if self.bus is not None:
            await self.bus.close()
        if self.link is not None:
            await self.link.close()
        if self.engine is not None:
            await self.engine.stop(0.5)

    # -- the roles the suite plays: scheduler, runner, harness, evaluator ------------------------
    async def publish(self, payload: message.Message, producer: str, correlation_id: str) -> None:
        assert self.bus is not None
        await self.bus.publish(new_event(payload, producer=producer, correlation_id=correlation_id))

    async def submit_group(self, size: int) -> list[Execution]:
        task_id = str(uuid.uuid4())
        group = [
            Execution(
                execution_id=str(uuid.uuid4()), task_id=task_id, token="faults-" + secrets.token_hex(20)
            )
            for _ in range(size)
        ]
        task = scheduler_pb2.Task(
            task_id=task_id,
            spec=scheduler_pb2.TaskSpec(family="terminal", group_size=size),
            executions=[
                ids_pb2.ExecutionRef(task_id=task_id, execution_id=e.execution_id, index_in_group=i)
                for i, e in enumerate(group)
            ],
        )
        await self.publish(scheduler_events.TaskSubmitted(task=task), "scheduler", task_id)
        for e in group:
            request = proxy_pb2.RegisterExecutionTokenRequest(
                request_id=f"register:{e.execution_id}", token=e.token
            )
            request.execution.execution_id, request.execution.task_id = e.execution_id, task_id
            request.expires_at.FromDatetime(datetime.now(UTC) + timedelta(hours=1))
            await self._proxy_call("RegisterExecutionToken", request)
        return group

    async def run_harness(self, e: Execution, *, turns: int, deadline_s: float = 120.0) -> None:
        """`turns` model calls, each retried until answered (a fault may cut one)."""
        messages: list[dict[str, str]] = [{"role": "user", "content": "Fix the failing test."}]
        deadline = time.monotonic() + deadline_s
        async with aiohttp.ClientSession() as http:
            for turn in range(turns):
                while True:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"execution {e.execution_id}: turn {turn} never answered")
                    try:
                        async with http.post(
                            f"{self.proxy_url}/v1/chat/completions",
                            json={"model": "tiny", "messages": messages, "max_tokens": 16},
                            headers={"Authorization": f"Bearer {e.token}"},
                        ) as resp:
                            if resp.status == 200:
                                body = await resp.json()
                                break
                    except (TimeoutError, aiohttp.ClientError):
                        pass
                    await asyncio.sleep(RETRY_S)
                e.answered.append(str(uuid.UUID(body["id"].removeprefix("chatcmpl-"))))
                messages += [
                    {"role": "assistant", "content": body["choices"][0]["message"]["content"]},
                    {"role": "user", "content": f"Now step {turn + 2}."},
                ]

    async def end(self, e: Execution, *, score: float) -> None:
        """The runner's revocation (retried while the proxy is away), then the evaluator's reward."""
        await self.revoke(e)
        await self.reward(e, score=score)

    async def revoke(self, e: Execution) -> None:
        """The runner's revocation, which learns the proxy's count of recorded calls."""
        request = proxy_pb2.RevokeExecutionTokenRequest(
            request_id=f"revoke:{e.execution_id}", execution_id=e.execution_id
        )
        answer = await self._proxy_call("RevokeExecutionToken", request)
        e.num_recorded = answer.num_calls_recorded

    async def reward(self, e: Execution, *, score: float) -> None:
        """The evaluator's reward, carrying the count `revoke` learned."""
        grade = evaluator_pb2.Grade(
            execution_id=e.execution_id, task_id=e.task_id, score=score, assessable=True
        )
        await self.publish(
            evaluator_events.RewardAssigned(grade=grade, num_calls_recorded=e.num_recorded),
            "evaluator",
            e.task_id,
        )

    async def _proxy_call(self, method: str, request: message.Message, *, deadline_s: float = 120.0) -> Any:
        deadline = time.monotonic() + deadline_s
        while True:
            try:
                async with grpc.aio.insecure_channel(self.proxy_address) as channel:
                    return await getattr(proxy_pb2_grpc.ProxyServiceStub(channel), method)(
                        request, timeout=30
                    )
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(RETRY_S)

    # -- what the suite checks -----------------------------------------------------------------
    async def stored_calls(self, execution_id: str) -> list[str]:
        async with grpc.aio.insecure_channel(self.trajectory_address) as channel:
            stub = trajectory_pb2_grpc.TrajectoryServiceStub(channel)
            try:
                tree = await stub.GetExecutionTree(
                    trajectory_pb2.GetExecutionTreeRequest(execution_id=execution_id)
                )
            except grpc.aio.AioRpcError as err:
                if err.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE):
                    return []
                raise
        return [c.call_id for c in tree.tree.calls]

    async def events(self, service: str, cls: type[message.Message]) -> list[Any]:
        """Every event of one type on a producer's stream, in order."""
        return await read_events(str(self.kernel.nats_url), self.kernel.bus_prefix, service, cls)

    async def replay_steps(self) -> tuple[int, int]:
        """(steps, mismatches): every step's batch re-derived from the log (`gyre replay step`)."""
        from gyre_app.client import GyreClient
        from gyre_app.client.addresses import ServiceAddresses
        from gyre_app.replay_step import replay_step

        versions = sorted(
            {s.version.steps for s in await self.events("trainer", trainer_events.StepCompleted)}
        )
        known = {"trajectory": self.trajectory_address, "trainer": self.services["trainer"].ready}
        bad = 0
        async with GyreClient(ServiceAddresses(known=known), timeout_s=60.0) as client:
            for version in versions:
                bad += int(not (await replay_step(client, version)).matches)
        return len(versions), bad

    async def group_ready_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for event in await self.events("trajectory", trajectory_events.GroupReady):
            counts[event.task_id] = counts.get(event.task_id, 0) + 1
        return counts

    async def trained_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for step in await self.events("trainer", trainer_events.StepCompleted):
            for task_id in step.task_ids:
                counts[task_id] = counts.get(task_id, 0) + 1
        return counts


async def read_events(nats_url: str, prefix: str, service: str, cls: type[message.Message]) -> list[Any]:
    """Every event of one type on a producer's stream, in order (an ordered consumer)."""
    nc = await nats.connect(nats_url)
    try:
        subject = f"{prefix}.{service}.v1.{cls.DESCRIPTOR.name}"
        try:
            sub = await nc.jetstream().subscribe(
                subject, stream=stream_name(service, prefix=prefix), ordered_consumer=True
            )
        except nats.js.errors.NotFoundError:
            return []
        out = []
        for _ in range(100_000):  # bounded: a run publishes far fewer
            try:
                msg = await sub.next_msg(timeout=0.5)
            except TimeoutError:
                break
            event = cls()
            envelope_pb2.Envelope.FromString(msg.data).payload.Unpack(event)
            out.append(event)
        await sub.unsubscribe()
        return out
    finally:
        await nc.close()
