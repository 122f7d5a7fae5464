"""The harness-side escape corpus through the real runner service: StartExecution over gRPC, the
built-in agent writing and running each attack, end events read from NATS (GYRE_NATS_URL and
GYRE_DATABASE_URL, else the embedded servers)."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

import grpc
import nats
import nats.js.errors

from bench.escape_attacks import ATTACKS, LIMITS, Listener, Targets, attack_code, judge, uid_processes
from bench.scripted_model import ScriptedModel
from bench.slice import servers
from gyre.common.v1 import envelope_pb2, ids_pb2
from gyre.devstack.scratch import scratch_kernel
from gyre.events import stream_name
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.sandbox.trees import folder_bytes
from gyre.settings import KernelSettings
from services.runner.config import RunnerSettings
from services.runner.main import build_with_supervisor

SERVICE_DEADLINE_S = 12.0
"""Through the service the built-in agent starts first (a second or two) before the attack runs."""


def service_script(name: str, t: Targets) -> dict[str, list[dict[str, Any]]]:
    """What the scripted model tells the built-in agent to do: write the attack, run it, stop."""
    return {
        "main": [
            {"tool": "write_file", "args": {"path": "attack.py", "content": attack_code(name, t)}},
            {
                "tool": "shell",
                "args": {"command": f"(echo {RAN}; {sys.executable} -u attack.py) > attack.out 2>&1"},
            },
            {"final": "done"},
        ]
    }


RAN = "ATTACK-RAN"
"""First line of an attack's output through the service: without it the agent never ran the
attack, and that run proves nothing (judged not contained)."""

SERVICE_BENIGN = {
    "main": [
        {"tool": "write_file", "args": {"path": "ok.txt", "content": "ok"}},
        {"tool": "shell", "args": {"command": "sleep 2"}},
        {"final": "done"},
    ]
}


async def through_runner_service(
    t: Targets, listener: Listener, model: ScriptedModel, model_url: str, root: Path
) -> tuple[list[dict[str, Any]], bool]:
    """The harness-side attacks as executions of the real runner service: StartExecution over
    gRPC, the built-in agent writing and running the attack, end events read from NATS; a
    well-behaved execution runs beside them. Own database and bus prefix, removed afterwards."""
    nats_url, admin_url = servers()
    async with scratch_kernel(nats_url, admin_url, label="bench_sandbox") as kernel:
        return await attacks_as_executions(kernel, t, listener, model, model_url, root)


async def attacks_as_executions(
    kernel: KernelSettings, t: Targets, listener: Listener, model: ScriptedModel, model_url: str, root: Path
) -> tuple[list[dict[str, Any]], bool]:
    settings = RunnerSettings(
        sandbox_root=root / "service",
        uid_base=63000,
        proxy_base_url=model_url,
        cpu_s=LIMITS.cpu_s,
        memory_mb=LIMITS.memory_mb,
        max_procs=LIMITS.max_procs,
        file_size_mb=LIMITS.file_size_mb,
        disk_mb=LIMITS.disk_mb,
        cpus=LIMITS.cpus,
        max_connections=LIMITS.max_connections,
        max_running=len(ATTACKS) + 1,
        keep_workspace_s=3600,
    )
    for a in ATTACKS:
        model.scripts[a] = service_script(a, t)
    model.scripts["benign"] = SERVICE_BENIGN
    host, supervisor = await build_with_supervisor(settings, kernel)
    await host.start()
    channel = grpc.aio.insecure_channel(host.address)
    stub = runner_pb2_grpc.RunnerServiceStub(channel)
    results: list[dict[str, Any]] = []
    try:
        ids: dict[str, str] = {}
        before = listener.hits
        for a in (*ATTACKS, "benign"):
            ref = ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=str(uuid.uuid4()))
            ids[a] = ref.execution_id
            await stub.StartExecution(
                runner_pb2.StartExecutionRequest(
                    request_id=f"bench-{a}", execution=ref, harness="gyre-agent", prompt=f"[script: {a}]",
                    timeout_s=SERVICE_DEADLINE_S, family="terminal",
                )
            )  # fmt: skip
        ended = await end_events(kernel, set(ids.values()), within_s=SERVICE_DEADLINE_S + 60)
        for _ in range(50):  # bounded: end events come after the workspace is kept
            if all(i in supervisor.ended for i in ids.values()):
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.3)
        for a in ATTACKS:
            box = supervisor.ended[ids[a]][0]
            out = box.work / "attack.out"
            output = out.read_text(errors="replace") if out.is_file() else ""
            contained, detail = judge(
                a,
                output,
                t,
                leftover=uid_processes(box.uid),
                used_bytes=folder_bytes(box.path),
                listener_hits=listener.hits - before,
                peak=box.forwarder.peak if box.forwarder is not None else 0,
            )
            if RAN not in output:
                contained, detail = False, f"the attack never ran: {detail}"
            results.append(
                {"via": "runner-service", "attack": a, "contained": contained, "detail": detail,
                 "ended": ended.get(ids[a], "no end event")}
            )  # fmt: skip
        results.append(await host_folder_template(stub))
        benign_box = supervisor.ended[ids["benign"]][0]
        benign_ok = ended.get(ids["benign"]) == "ExecutionFinished" and (
            (benign_box.work / "ok.txt").read_text() == "ok"
        )
    finally:
        await channel.close()
        await host.stop()
        supervisor.host.sweep()
    return results, benign_ok


async def host_folder_template(stub: runner_pb2_grpc.RunnerServiceStub) -> dict[str, Any]:
    """Issue 16, case 8: a host folder as the workspace template must be refused, not copied."""
    ref = ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=str(uuid.uuid4()))
    request = runner_pb2.StartExecutionRequest(
        request_id=f"bench-template-{ref.execution_id[:8]}", execution=ref, harness="gyre-agent",
        prompt="p", timeout_s=5.0, family="terminal", workspace_template="/etc/ssl",
    )  # fmt: skip
    try:
        await stub.StartExecution(request)
        contained, detail = False, "/etc/ssl was accepted as a workspace template"
    except grpc.aio.AioRpcError as err:
        contained = err.code() == grpc.StatusCode.INVALID_ARGUMENT
        detail = f"{err.code().name}: {(err.details() or '')[:60]}"
    return {"via": "runner-service", "attack": "host_folder_template", "contained": contained,
            "detail": detail, "ended": "refused" if contained else "accepted"}  # fmt: skip


END_EVENTS = ("ExecutionFinished", "ExecutionTimedOut", "ExecutionFailed", "ExecutionCancelled")


async def end_events(kernel: KernelSettings, ids: set[str], *, within_s: float) -> dict[str, str]:
    """Execution id -> the name of its end event on the runner's stream."""
    nc = await nats.connect(kernel.nats_url)
    js = nc.jetstream()
    found: dict[str, str] = {}
    try:
        for _ in range(int(within_s * 2)):  # bounded
            try:
                info = await js.stream_info(stream_name("runner", prefix=kernel.bus_prefix))
            except nats.js.errors.NotFoundError:
                info = None
            if info is not None:
                for seq in range(max(info.state.first_seq, 1), info.state.last_seq + 1):
                    env = envelope_pb2.Envelope()
                    env.ParseFromString((await js.get_msg(info.config.name or "", seq)).data or b"")
                    kind = env.event_type.rsplit(".", 1)[-1]
                    if kind in END_EVENTS:
                        payload: Any = getattr(runner_events, kind)()
                        env.payload.Unpack(payload)
                        found[payload.execution.execution_id] = kind
            if ids <= set(found):
                break
            await asyncio.sleep(0.5)
    finally:
        await nc.close()
    return found
