"""What this runner can run, told to the scheduler (shell: PATH lookups, folders, one RPC).

`offer` describes the runner: every harness adapter with its program looked up on the PATH its
sandboxes get (the runner's `sandbox_runtime` first, as `plan_launch` builds it), the harness_env
each adapter reads, the registered task sets and their tasks, the git URL prefixes and the keys
the runner sets itself. `Registration.run` sends it at start and every `REGISTER_EVERY_S`, so a
harness installed later, or a restarted scheduler, is seen within that; while the scheduler is
away it keeps trying. The scheduler refuses at submission what no registered runner could run
(services/scheduler/runner_offers.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
from typing import Any

import grpc
import structlog

from gyre.scheduler.v1 import scheduler_pb2
from services.runner.config import RunnerSettings
from services.runner.harness import DEFAULT_PATH, REGISTRY, RESERVED_ENV

log = structlog.get_logger(__name__)
REGISTER_EVERY_S = 30.0


def sandbox_path(settings: RunnerSettings) -> str:
    """The PATH a harness gets (`plan_launch`): runtime folders, the runner's Python, the system's."""
    return ":".join([*settings.sandbox_runtime, os.path.dirname(sys.executable), DEFAULT_PATH])


def offer(settings: RunnerSettings) -> scheduler_pb2.RegisterRunnerRequest:
    path = sandbox_path(settings)
    harnesses = [
        scheduler_pb2.HarnessOffer(
            name=name,
            binary=h.binary,
            binary_found=not h.binary or shutil.which(h.binary, path=path) is not None,
            env_values=dict(h.env_values),
        )
        for name, h in sorted(REGISTRY.items())
    ]
    tasks = [
        f"{set_name}/{task.name}"
        for set_name, folder in sorted(settings.task_sets.items())
        if folder.is_dir()
        for task in sorted(folder.iterdir())
        if (task / "workspace").is_dir()
    ]
    return scheduler_pb2.RegisterRunnerRequest(
        runner_id=f"{socket.gethostname()}:{settings.sandbox_root.resolve()}",
        harnesses=harnesses,
        task_sets=sorted(settings.task_sets),
        task_set_tasks=tasks,
        template_url_prefixes=list(settings.template_urls),
        reserved_env=sorted(RESERVED_ENV),
    )


class Registration:
    def __init__(self, settings: RunnerSettings, scheduler: Any):
        self.settings = settings
        self.scheduler = scheduler
        """A SchedulerService stub (grpc.aio: its calls are awaitable)."""

    async def run(self, stop: asyncio.Event) -> None:
        """Worker: register now and every REGISTER_EVERY_S until the runner stops."""
        while not stop.is_set():
            try:
                request = await asyncio.to_thread(offer, self.settings)
                await self.scheduler.RegisterRunner(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                log.warning("runner_registration_failed", code=exc.code().name, details=exc.details())
            except OSError as exc:  # a task set folder unreadable this time
                log.warning("runner_offer_unreadable", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=REGISTER_EVERY_S)
