"""Real harnesses through the runner on the tiny model: how long each call takes and what tree
the calls form (shell).

Starts a proxy, one torch engine with the tiny model, the trajectory service and the runner (real
sandboxes) on NATS and Postgres (GYRE_NATS_URL / GYRE_DATABASE_URL, else the embedded servers),
runs each harness once on the bundled task `csvsum` and prints, per harness, its end state, wall
time, calls (role, agent id, prompt and output tokens, seconds from the start to the call being
recorded) and trajectories. The tiny model writes nonsense: the harnesses use no tool, so this
measures serving their real prompts (Claude Code's first is ~53k tokens with all its tools,
~11k with `--claude-tools Bash,Read,Edit,Write,Agent`) on CPU. Claude Code comes from
`.gyre/harnesses/claude-code` (the tests install it there) or `--claude PATH`.

    python -m bench.harness_runs --json [--harness claude-code] [--timeout-s 1800] [--claude-tools T]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from gyre.common.v1 import ids_pb2
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.settings import KernelSettings
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.runner.config import RunnerSettings
from services.runner.main import build_with_supervisor

REPO = Path(__file__).resolve().parent.parent
CLAUDE_CODE = REPO / ".gyre" / "harnesses" / "claude-code" / "node_modules" / "@anthropic-ai"
TASK = "csvsum"
PROMPT = "data.csv has columns name,amount. Write total.txt holding the sum of the amount column."


@dataclass
class HarnessServices:
    """The runner and the trajectory service behind one proxy, as a harness run needs them."""

    runner: Any  # grpc.aio stubs: their calls are awaitable
    trajectory: Any

    async def run(self, harness: str, *, timeout_s: float, env: dict[str, str]) -> runner_pb2.Execution:
        """Start `harness` on the bundled task and wait for its end (bounded by its deadline)."""
        request = runner_pb2.StartExecutionRequest(
            request_id=f"start-{uuid.uuid4().hex[:8]}",
            execution=ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=str(uuid.uuid4())),
            harness=harness,
            prompt=PROMPT,
            workspace_template=f"task:{TASK}",
            timeout_s=timeout_s,
            family="terminal",
            harness_env=env,
        )
        await self.runner.StartExecution(request)
        get = runner_pb2.GetExecutionRequest(execution_id=request.execution.execution_id)
        for _ in range(int(timeout_s + 120) * 2):  # bounded: the deadline, then the token's revocation
            ex: runner_pb2.Execution = (await self.runner.GetExecution(get)).execution
            if ex.state not in (runner_pb2.EXECUTION_STATE_STARTING, runner_pb2.EXECUTION_STATE_RUNNING):
                return ex
            await asyncio.sleep(0.5)
        raise AssertionError(f"{harness} never ended")

    async def tree(self, execution_id: str, *, num_calls: int) -> trajectory_pb2.ExecutionTree:
        """The execution's tree once the trajectory service stored `num_calls` calls."""
        request = trajectory_pb2.GetExecutionTreeRequest(execution_id=execution_id)
        tree = trajectory_pb2.ExecutionTree()
        for _ in range(200):  # bounded: 20 s for the consumer to catch up
            with contextlib.suppress(grpc.aio.AioRpcError):
                answer: trajectory_pb2.GetExecutionTreeResponse = await self.trajectory.GetExecutionTree(
                    request
                )
                tree = answer.tree
                if len(tree.calls) >= num_calls:
                    return tree
            await asyncio.sleep(0.1)
        raise AssertionError(f"the tree has {len(tree.calls)} of {num_calls} calls")


@contextlib.asynccontextmanager
async def harness_services(
    kernel: KernelSettings, *, proxy_address: str, proxy_http_url: str, runtime: Sequence[str]
) -> AsyncIterator[HarnessServices]:
    """Trajectory service and runner (real sandboxes, 2 GiB each) for the proxy at the addresses;
    `runtime` folders (a harness's binary) are visible in every sandbox and lead its PATH."""
    from services.trajectory.config import TrajectorySettings
    from services.trajectory.main import build as build_trajectory

    trajectory = await build_trajectory(TrajectorySettings(port=0), kernel)
    await trajectory.start()
    settings = RunnerSettings(
        sandbox_root=REPO / ".gyre" / "test-sandboxes" / uuid.uuid4().hex[:8],
        proxy_address=proxy_address,
        proxy_base_url=proxy_http_url,
        sandbox_runtime=list(runtime),
        memory_mb=2048,  # the address space too, but for Claude Code, whose entry raises it
        disk_mb=256,
    )
    runner, supervisor = await build_with_supervisor(settings, kernel)
    await runner.start()
    channels = [grpc.aio.insecure_channel(runner.address), grpc.aio.insecure_channel(trajectory.address)]
    try:
        yield HarnessServices(
            runner=runner_pb2_grpc.RunnerServiceStub(channels[0]),
            trajectory=trajectory_pb2_grpc.TrajectoryServiceStub(channels[1]),
        )
    finally:
        for channel in channels:
            await channel.close(None)
        await runner.stop()
        if not os.environ.get("GYRE_KEEP_SANDBOXES"):
            supervisor.host.sweep()
            supervisor.host.root.rmdir()
        await trajectory.stop(grace_s=1)


def claude_code_binary() -> Path | None:
    found = sorted(CLAUDE_CODE.glob("claude-code-linux-*/claude"))
    return found[0] if found else None


def summary(
    ended: runner_pb2.Execution, tree: trajectory_pb2.ExecutionTree, started: float
) -> dict[str, Any]:
    calls = [
        {
            "role": c.agent_role,
            "agent_id": c.agent_id,
            "prompt_tokens": c.num_prompt_tokens,
            "output_tokens": c.num_output_tokens,
            "shared_prompt_tokens": c.num_shared_prompt_tokens,
        }
        for c in tree.calls
    ]
    trajectories = [
        {
            "role": t.agent_role,
            "agent_id": t.agent_id,
            "calls": len(t.call_ids),
            "shared_prefix_with": t.shared_prefix_with.rsplit("/", 1)[-1],
        }
        for t in tree.trajectories
    ]
    state = runner_pb2.ExecutionState.Name(ended.state).removeprefix("EXECUTION_STATE_").lower()
    wall_s = round(time.monotonic() - started, 1)
    return {"state": state, "wall_s": wall_s, "num_calls": len(calls), "calls": calls,
            "trajectories": trajectories}  # fmt: skip


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    from bench.slice import servers
    from gyre.devstack.scratch import scratch_kernel
    from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc
    from services.engine.config import EngineSettings
    from services.engine.main import build as build_engine
    from services.engine.model_init import init_model
    from services.proxy.config import ProxySettings
    from services.proxy.main import build_proxy

    claude = Path(args.claude) if args.claude else claude_code_binary()
    if "claude-code" in args.harness and (claude is None or not claude.is_file()):
        raise SystemExit("Claude Code is not installed: run the tests once, or pass --claude PATH")
    nats_url, db_url = servers()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = init_model(Path(tmp) / "tiny")
        async with scratch_kernel(nats_url, db_url, label="harness") as kernel:
            proxy = await build_proxy(ProxySettings(model_dir=model_dir, model_name="tiny"), kernel)
            await proxy.host.start()
            engine = await build_engine(
                EngineSettings(model_dir=model_dir, engine_id="torch-b", cell_id="cell-b",
                               publish_events=False, init_model_if_missing=False),
                kernel,
            )  # fmt: skip
            await engine.start()
            channel = grpc.aio.insecure_channel(proxy.host.address)
            await proxy_pb2_grpc.ProxyServiceStub(channel).RegisterEngine(
                proxy_pb2.RegisterEngineRequest(
                    request_id=f"b-{uuid.uuid4().hex[:6]}", cell_id="cell-b", engine_id="torch-b",
                    address=engine.address,
                )
            )  # fmt: skip
            runtime = [str(claude.parent)] if claude is not None else []
            try:
                async with harness_services(
                    kernel, proxy_address=proxy.host.address, proxy_http_url=proxy.http_url, runtime=runtime
                ) as services:
                    env = {"GYRE_HARNESS_MAX_TURNS": str(args.max_turns),
                           "GYRE_HARNESS_MAX_OUTPUT_TOKENS": str(args.max_output_tokens)}  # fmt: skip
                    if args.claude_tools:
                        env["GYRE_CLAUDE_CODE_TOOLS"] = args.claude_tools
                    for harness in args.harness:
                        started = time.monotonic()
                        ended = await services.run(harness, timeout_s=args.timeout_s, env=env)
                        tree = await services.tree(ended.execution.execution_id, num_calls=0)
                        results[harness] = summary(ended, tree, started)
            finally:
                await channel.close(None)
                await engine.stop(grace_s=1)
                await proxy.host.stop(grace_s=1)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.harness_runs", description=__doc__)
    parser.add_argument("--harness", action="append", choices=["claude-code", "mini-swe-agent"])
    parser.add_argument("--timeout-s", type=float, default=1800.0)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-output-tokens", type=int, default=32)
    parser.add_argument("--claude", default="", help="the Claude Code binary (default: the tests' install)")
    parser.add_argument(
        "--claude-tools", default="", help="Claude Code's built-in tools, e.g. Bash,Read (default: all)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    args = parser.parse_args(argv)
    args.harness = args.harness or ["mini-swe-agent", "claude-code"]
    results = asyncio.run(measure(args))
    print(json.dumps(results) if args.json else json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
