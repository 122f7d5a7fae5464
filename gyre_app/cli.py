"""The `gyre` command: local stack, migrations, demo, code generation (shell)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from gyre.settings import KernelSettings


def _cmd_up(ns: argparse.Namespace, kernel: KernelSettings) -> int:
    from gyre_app.stack import up

    state = up(kernel, metrics=ns.metrics)
    print(
        json.dumps(
            {
                "nats_url": state.nats_url,
                "database_url": state.database_url,
                "services": {s.name: s.address for s in state.services},
                "proxy_http_url": state.proxy_http_url,
                "model_dir": state.model_dir,
                **({"metrics": {s.name: s.metrics_url for s in state.services}} if ns.metrics else {}),
            },
            indent=2,
        )
    )
    return 0


def _cmd_down(ns: argparse.Namespace, kernel: KernelSettings) -> int:
    from gyre_app.stack import down, stop_embedded_servers

    stopped = down(kernel)
    if ns.all:
        stopped += stop_embedded_servers(kernel.state_dir)
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")
    return 0


def _cmd_restart(ns: argparse.Namespace, kernel: KernelSettings) -> int:
    from gyre_app.stack import restart

    try:
        service = restart(kernel, ns.service)
    except RuntimeError as exc:
        raise SystemExit(f"gyre restart: {exc}") from None
    print(json.dumps({"service": service.name, "pid": service.pid, "address": service.address}))
    return 0


def _cmd_migrate(ns: argparse.Namespace, kernel: KernelSettings) -> int:
    from gyre.settings import resolve_urls
    from gyre_app.migrations import upgrade_all

    print("migrated:", ", ".join(upgrade_all(resolve_urls(kernel).database_url)))
    return 0


def _cmd_demo(ns: argparse.Namespace, kernel: KernelSettings) -> int:
    from gyre_app.demo import main as demo

    return demo(kernel, keep=ns.keep)


# Commands that belong to a service live in that service and are loaded only when named, so the
# kernel imports no service and `gyre up` does not pay for torch. Each module has
# `main(argv: list[str]) -> int`.
SERVICE_COMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("services.scheduler.sim.cli", "simulate the scheduling modes on a workload file"),
    "trajectory": ("services.trajectory.cli", "import call records, print replayed samples"),
    "model": ("services.engine.cli", "create a tiny local model checkpoint"),
    "evaluate": ("services.evaluator.cli", "grade one workspace offline"),
    "tasks": ("services.evaluator.generate.cli", "generate seeded task sets (repo-gen, repair, terminal)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gyre", description="Gyre: RL for hour-long coding-agent rollouts.")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start NATS, Postgres (embedded unless configured) and every service")
    up.add_argument(
        "--metrics", action="store_true", help="each service serves Prometheus metrics on 127.0.0.1"
    )
    up.set_defaults(func=_cmd_up)
    down = sub.add_parser("down", help="stop what `gyre up` started")
    down.add_argument(
        "--all", action="store_true", help="also the embedded servers tests and benchmarks left running"
    )
    down.set_defaults(func=_cmd_down)
    restart = sub.add_parser("restart", help="restart one service of the running stack in place")
    restart.add_argument("service", help="engine, scheduler, trajectory, runner, evaluator, proxy or trainer")
    restart.set_defaults(func=_cmd_restart)
    sub.add_parser("migrate", help="bring every service's schema up to date").set_defaults(func=_cmd_migrate)
    demo = sub.add_parser("demo", help="run the end-to-end slice on the local stack and narrate it")
    demo.add_argument("--keep", action="store_true", help="leave the stack running afterwards")
    demo.set_defaults(func=_cmd_demo)
    for name, (_, summary) in SERVICE_COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    return parser


def _run_service_command(name: str, argv: list[str]) -> int:
    import importlib

    module_name, _ = SERVICE_COMMANDS[name]
    module = importlib.import_module(module_name)
    return int(module.main(argv))


def main(argv: list[str] | None = None) -> int:
    # `gyre up/down` fork servers after gRPC calls; grpc's fork handlers are not needed for that.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["model"] and "--warm-start" in argv:  # the warm start needs every service's parts
        from gyre_app.warmstart.cli import main as warm_start

        return warm_start(argv[1:])
    if argv and argv[0] in SERVICE_COMMANDS:
        return _run_service_command(argv[0], argv[1:])
    ns = build_parser().parse_args(argv)
    from gyre.errors import GyreError

    try:
        return int(ns.func(ns, KernelSettings()))
    except (GyreError, RuntimeError) as exc:
        print(f"gyre {ns.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
