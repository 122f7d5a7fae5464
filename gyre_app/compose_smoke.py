"""`make compose-smoke`: deploy/docker-compose.yml up with Podman, the quick demo against it, down (shell).

1. The images, built here without a registry (`compose_images`; cached by content hash).
2. The run file (`compose_plan.smoke_compose`) under a project name of its own, and
   `podman-compose up --no-start`: the network, the volumes and every container, as the file says.
3. Each service started once what it `depends_on` holds (`compose_plan.start_order`): the
   dependency started, healthy, or completed successfully. Podman before 4.6 cannot wait for
   health and runs no health check by itself without systemd, so this runs each check
   (`podman healthcheck run`) until it passes, as Docker's daemon would on its timer.
4. `gyre demo --quick`'s loop (`demo.run_loop`) from the host against the published ports, over
   mutual TLS with the client certificate and the NATS password the stack's `certs` job made.
5. `podman-compose down --volumes`, then a check that nothing of the project is left (anything
   left is removed by name and reported).

Every wait is bounded. Prints one JSON object on its last line: build, up, demo and down times,
`demo_ok`, and what was left over.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from gyre.errors import Unavailable
from gyre_app.compose_images import DEPLOY, build_images
from gyre_app.compose_plan import PUBLISHED, dependencies, smoke_compose, start_order
from gyre_app.images import _engine
from gyre_app.stack import ServiceProcess, StackState, distinct_free_ports

COMPOSE_FILE = DEPLOY / "docker-compose.yml"
UP_TIMEOUT_S = 900.0
"""Every service healthy within this (each imports torch; 2 busy cores take minutes)."""
CLI_TIMEOUT_S = 300.0
POLL_S = 2.0
DEMO_TIMEOUT_S = 300.0
"""The demo's loop (150 s under `gyre up`): here ten containers share the machine's cores."""


@dataclass(slots=True)
class SmokeResult:
    project: str = ""
    build_s: float = 0.0
    built: list[str] = field(default_factory=list)
    up_s: float = 0.0
    demo_s: float = 0.0
    demo_ok: bool = False
    down_s: float = 0.0
    leftovers: list[str] = field(default_factory=list)
    error: str = ""


def _run(argv: Sequence[str], *, timeout_s: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)


def podman(*args: str, timeout_s: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    return _run([*_engine(), *args], timeout_s=timeout_s)


def podman_compose(project: str, file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        sys.executable,
        "-m",
        "podman_compose",
        "--in-pod",
        "false",
        "-p",
        project,
        "-f",
        str(file),
        *args,
    ]
    done = _run(argv)
    if done.returncode != 0:
        raise Unavailable(
            f"podman-compose {' '.join(args)} failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    return done


def project_containers(project: str) -> dict[str, str]:
    """Service name -> container name, for the containers podman-compose made for `project`."""
    done = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={project}", "--format", "json")
    listed: list[dict[str, Any]] = json.loads(done.stdout or "[]")
    return {c["Labels"]["com.docker.compose.service"]: c["Names"][0] for c in listed}


class Bringup:
    """Starts each container once its dependencies' conditions hold (one task per service)."""

    def __init__(self, services: dict[str, Any], containers: dict[str, str], deadline: float) -> None:
        self.services = services
        self.containers = containers
        self.deadline = deadline
        self.started: dict[str, asyncio.Event] = {name: asyncio.Event() for name in services}
        self.waits: dict[tuple[str, str], asyncio.Task[None]] = {}

    async def podman(self, *args: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            *_engine(), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=CLI_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return 124, f"podman {' '.join(args[:2])} did not answer in {CLI_TIMEOUT_S:g} s"
        return proc.returncode or 0, out.decode(errors="replace")

    def _left(self, what: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Unavailable(f"compose smoke: gave up waiting for {what}")
        return left

    async def _condition(self, name: str, condition: str) -> None:
        await asyncio.wait_for(self.started[name].wait(), timeout=self._left(f"{name} to start"))
        container = self.containers[name]
        while condition != "service_started":
            if condition == "service_healthy":
                code, _ = await self.podman("healthcheck", "run", container)
                if code == 0:
                    return
            else:  # service_completed_successfully
                _, state = await self.podman(
                    "inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", container
                )
                status, _, exit_code = state.strip().partition(" ")
                if status in ("exited", "stopped"):
                    if exit_code != "0":
                        raise Unavailable(f"compose smoke: {name} exited {exit_code}")
                    return
            self._left(f"{name} to be {condition.removeprefix('service_')}")
            await asyncio.sleep(POLL_S)

    def condition(self, name: str, condition: str) -> asyncio.Task[None]:
        key = (name, condition)
        if key not in self.waits:  # one poller per dependency, however many wait on it
            self.waits[key] = asyncio.create_task(self._condition(name, condition))
        return self.waits[key]

    async def start(self, name: str) -> None:
        await asyncio.gather(*(self.condition(d, c) for d, c in dependencies(self.services[name]).items()))
        code, out = await self.podman("start", self.containers[name])
        if code != 0:
            raise Unavailable(f"compose smoke: podman start {name} failed: {out[-500:]}")
        self.started[name].set()

    async def run(self) -> None:
        """Start everything, then wait until every service with a health check is healthy (as
        `docker compose up --wait`)."""
        await asyncio.gather(*(self.start(name) for name in start_order(self.services)))
        checked = [n for n, s in self.services.items() if s.get("healthcheck")]
        await asyncio.gather(*(self.condition(n, "service_healthy") for n in checked))


def shared_folder(path: Path) -> Path:
    """`path` as a mount point of its own with shared propagation: the runner's workspace mounts
    under it reach the evaluator's container (this machine's / is a private mount)."""
    path.mkdir()
    for argv in (["mount", "--bind", str(path), str(path)], ["mount", "--make-rshared", str(path)]):
        done = _run(argv)
        if done.returncode != 0:
            raise Unavailable(
                f"compose smoke: {' '.join(argv[:2])} failed (root is needed): {done.stderr.strip()}"
            )
    return path


def secrets_folder(project: str) -> Path:
    done = podman("volume", "inspect", "--format", "{{.Mountpoint}}", f"{project}_secrets")
    if done.returncode != 0:
        raise Unavailable(f"compose smoke: the secrets volume is missing: {done.stderr.strip()}")
    return Path(done.stdout.strip())


def run_demo(project: str, ports: dict[str, int]) -> bool:
    """The quick demo's loop from the host, as a client of the secured stack."""
    from gyre_app.demo import run_loop

    secrets = secrets_folder(project)
    os.environ |= {
        "GYRE_TLS_CA_FILE": str(secrets / "ca.pem"),
        "GYRE_TLS_CERT_FILE": str(secrets / "client.pem"),
        "GYRE_TLS_KEY_FILE": str(secrets / "client.key"),
    }
    password = (secrets / "nats.password").read_text().strip()
    state = StackState(
        nats_url=f"nats://gyre:{quote(password, safe='')}@127.0.0.1:{ports['nats']}",
        database_url="",
        embedded_nats=False,
        embedded_postgres=False,
        services=[
            ServiceProcess(name="scheduler", pid=0, address=f"127.0.0.1:{ports['scheduler']}", log_path=""),
            ServiceProcess(name="trajectory", pid=0, address=f"127.0.0.1:{ports['trajectory']}", log_path=""),
            ServiceProcess(name="engine-cell-1", pid=0, address=f"127.0.0.1:{ports['engine']}", log_path=""),
        ],
    )
    tally = asyncio.run(run_loop(state, "gyre", timeout_s=DEMO_TIMEOUT_S))
    return bool(tally.steps) and tally.engine_version > 0


def leftovers(project: str) -> list[str]:
    """Containers, volumes and networks of `project` still present."""
    found = []
    label = f"label=io.podman.compose.project={project}"
    for kind, listing in (
        ("container", podman("ps", "-a", "--filter", label, "--format", "{{.Names}}")),
        ("volume", podman("volume", "ls", "--filter", label, "--format", "{{.Name}}")),
        ("network", podman("network", "ls", "--filter", label, "--format", "{{.Name}}")),
    ):
        found += [f"{kind} {name}" for name in listing.stdout.split()]
    return found


def remove(found: Sequence[str]) -> None:
    for entry in found:
        kind, name = entry.split(" ", 1)
        args = {
            "container": ("rm", "-f", "-t", "2"),
            "volume": ("volume", "rm", "-f"),
            "network": ("network", "rm"),
        }
        podman(*args[kind], name)


def show_logs(containers: dict[str, str]) -> None:
    for name, container in containers.items():
        tail = podman("logs", "--tail", "40", container)
        print(f"--- {name} ---\n{(tail.stdout + tail.stderr)[-6000:]}", file=sys.stderr)


def smoke(*, demo: bool = True) -> SmokeResult:
    result = SmokeResult(project=f"gyre-smoke-{uuid.uuid4().hex[:8]}")
    started = time.monotonic()
    report = build_images()
    result.build_s, result.built = round(time.monotonic() - started, 1), report.built
    ports = dict(zip(PUBLISHED, distinct_free_ports(len(PUBLISHED)), strict=True))
    containers: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="gyre-compose-") as tmp:
        sandboxes = shared_folder(Path(tmp) / "sandboxes")
        plan = smoke_compose(
            yaml.safe_load(COMPOSE_FILE.read_text()), report.images, ports, {"./sandboxes": str(sandboxes)}
        )
        file = Path(tmp) / "compose.yml"
        file.write_text(yaml.safe_dump(plan, sort_keys=False))
        try:
            started = time.monotonic()
            # --no-deps: no `--requires` between containers, with which `podman start` would start
            # (again) what a container depends on, finished jobs included; the order is ours.
            podman_compose(result.project, file, "up", "--no-start", "--no-deps")
            containers = project_containers(result.project)
            bringup = Bringup(plan["services"], containers, time.monotonic() + UP_TIMEOUT_S)
            asyncio.run(bringup.run())
            result.up_s = round(time.monotonic() - started, 1)
            if demo:
                started = time.monotonic()
                result.demo_ok = run_demo(result.project, ports)
                result.demo_s = round(time.monotonic() - started, 1)
        except Exception as exc:
            result.error = f"{type(exc).__name__}: {exc}"
            show_logs(containers)
        finally:
            started = time.monotonic()
            try:
                podman_compose(result.project, file, "down", "--volumes", "-t", "5")
            except Unavailable as exc:
                result.error = result.error or str(exc)
            result.leftovers = leftovers(result.project)
            remove(result.leftovers)
            _run(["umount", "--recursive", "--lazy", str(sandboxes)])
            result.down_s = round(time.monotonic() - started, 1)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gyre_app.compose_smoke", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--no-demo", action="store_true", help="bring the stack up and down only")
    parser.add_argument("--json", action="store_true", help="only the JSON summary (always the last line)")
    args = parser.parse_args(argv)
    result = smoke(demo=not args.no_demo)
    summary = {
        "project": result.project,
        "build_s": result.build_s,
        "built": result.built,
        "compose_up_s": result.up_s,
        "demo_s": result.demo_s,
        "compose_demo_ok": result.demo_ok,
        "down_s": result.down_s,
        "leftovers": result.leftovers,
        "error": result.error,
    }
    if not args.json:
        print(f"compose smoke: {'ok' if result.demo_ok else 'FAILED'} ({result.error or 'no error'})")
    print(json.dumps(summary))
    return 0 if (result.demo_ok or args.no_demo) and not result.error and not result.leftovers else 1


if __name__ == "__main__":
    raise SystemExit(main())
