"""The `gyre` command: local stack, tasks, executions, replay and staleness (shell: typer + rich).

Every command has `--help`; every command that reads has `--json` (one JSON object on stdout).
An error is one line on stderr, `gyre <command>: <what was wrong>`: exit code 2 when the input
was wrong (an option, an argument, a file, a field a service refused), 1 when something else
failed (a service away, a task that does not exist).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.exceptions import TyperException

from gyre.errors import GyreError, InvalidArgument
from gyre.logs import configure_logging, redact
from gyre.settings import KernelSettings
from gyre_app import (
    cli_cells,
    cli_dead_letters,
    cli_export,
    cli_images,
    cli_replay,
    cli_report,
    cli_status,
    cli_tasks,
    cli_trace,
    cli_track,
)
from gyre_app.client.tasks_file import TasksFileError

INPUT_ERROR = 2
"""The exit code of a command whose input was wrong (click's own for usage errors)."""

app = typer.Typer(
    name="gyre",
    help="Gyre: RL for hour-long coding-agent rollouts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def up(
    metrics: Annotated[
        bool, typer.Option(help="each service serves Prometheus metrics on 127.0.0.1")
    ] = False,
    cells: Annotated[
        int, typer.Option(min=2, help="cells, the core included (default 3: a core and 2 satellites)")
    ] = 3,
    mode: Annotated[
        str, typer.Option(help="scheduling mode at start: colocate, async, gyre or burst")
    ] = "gyre",
    secure: Annotated[
        bool,
        typer.Option(help="mutual TLS between services; embedded NATS and Postgres ask for passwords"),
    ] = False,
    track: Annotated[str | None, typer.Option(help=cli_track.TRACK_HELP)] = None,
    proxy_processes: Annotated[
        int,
        typer.Option(
            min=1,
            max=64,
            help="proxy processes sharing the one API address, each execution served by one of them",
        ),
    ] = 1,
) -> None:
    """Start NATS, Postgres (embedded unless configured), every service and the cells."""
    from gyre_app.stack import MODES
    from gyre_app.stack import up as stack_up

    if mode not in MODES:
        raise typer.BadParameter(f"must be one of {', '.join(MODES)}, got {mode!r}", param_hint="--mode")
    sinks = cli_track.up_sinks(track)  # refused here, before anything starts
    state = stack_up(
        KernelSettings(),
        metrics=metrics,
        cells=cells,
        mode=mode,
        secure=secure,
        proxy_processes=proxy_processes,
    )
    tracking = cli_track.start_for_up(sinks)
    print(
        json.dumps(
            {
                "nats_url": redact(state.nats_url),
                "database_url": redact(state.database_url),
                **({"tls": state.tls} if state.tls else {}),
                "services": {s.name: s.address for s in state.services},
                "proxy_http_url": state.proxy_http_url,
                "model_dir": state.model_dir,
                "mode": state.mode,
                **({"tracking": tracking} if tracking else {}),
                **({"metrics": {s.name: s.metrics_url for s in state.services}} if metrics else {}),
            },
            indent=2,
        )
    )


@app.command()
def certs(
    folder: Annotated[Path, typer.Argument(help="where to write them (made 0700; files 0600)")],
    name: Annotated[list[str], typer.Option(help="a process to certify (repeat); `client` is always made")],
    host: Annotated[list[str] | None, typer.Option(help="another name every certificate holds")] = None,
) -> None:
    """Make a CA, a certificate per process and the NATS and Postgres passwords (deploy/ secrets)."""
    from gyre.devstack.credentials import nats_auth_config
    from gyre_app.secure import make_keys

    keys = make_keys(folder, name, hosts=tuple(host or ()))
    nats_auth_config(folder, (keys.nats_user, keys.nats_password))
    print(f"wrote a CA, {len(name) + 1} certificates and the passwords in {folder}")


@app.command()
def down(
    all_: Annotated[
        bool, typer.Option("--all", help="also the embedded servers tests and benchmarks left running")
    ] = False,
) -> None:
    """Stop what `gyre up` started."""
    from gyre_app.stack import down as stack_down
    from gyre_app.stack_servers import stop_embedded_servers

    kernel = KernelSettings()
    cli_track.stop_for_down(kernel)
    stopped = stack_down(kernel)
    if all_:
        stopped += stop_embedded_servers(kernel.state_dir)
    print(f"stopped: {', '.join(stopped)}" if stopped else "nothing was running")


@app.command()
def restart(
    service: Annotated[
        str, typer.Argument(help="engine, scheduler, trajectory, runner, evaluator, proxy or trainer")
    ],
) -> None:
    """Restart one service of the running stack in place (its port and settings; nothing else touched)."""
    from gyre_app.stack_restart import restart as restart_service

    started = restart_service(KernelSettings(), service)
    print(json.dumps({"service": started.name, "pid": started.pid, "address": started.address}))


@app.command()
def migrate() -> None:
    """Bring every service's schema up to date."""
    from gyre.settings import resolve_database_url
    from gyre_app.migrations import upgrade_all

    print("migrated:", ", ".join(upgrade_all(resolve_database_url(KernelSettings()))))


@app.command()
def demo(
    keep: Annotated[bool, typer.Option(help="leave the stack running afterwards")] = False,
    learn: Annotated[
        bool, typer.Option(help="train the warm-started policy on generated tasks and write a report")
    ] = False,
    quick: Annotated[bool, typer.Option(help="the narrated one-task loop (the default)")] = False,
    steps: Annotated[int, typer.Option(help="--learn: training steps", min=1)] = 12,
    groups_per_step: Annotated[
        int, typer.Option(help="--learn: groups (tasks) each step trains on", min=1)
    ] = 2,
    train_pool: Annotated[
        int,
        typer.Option(help="--learn: training instances cycled epoch after epoch (also the probe set)", min=1),
    ] = 12,
    heldout: Annotated[
        int,
        typer.Option(
            help="--learn: held-out instances scored (bench.learning scores 32; the demo 8, for time)", min=1
        ),
    ] = 8,
    probe_samples: Annotated[
        int,
        typer.Option(help="--learn: samples of each probe and held-out instance per version scored", min=1),
    ] = 4,
    group_size: Annotated[int, typer.Option(help="--learn: executions per task (G)", min=2)] = 6,
    timeout_s: Annotated[int, typer.Option(help="--learn: each execution's deadline", min=5)] = 15,
    mode: Annotated[
        str, typer.Option(help="--learn: scheduling mode (colocate, async, gyre, burst)")
    ] = "gyre",
    families: Annotated[
        str, typer.Option(help="--learn: families of the task set trained on, comma-separated, or all")
    ] = "terminal",
    count: Annotated[
        int,
        typer.Option(
            help="--learn: instances per family (every 4th held out; 32 held out are scored)", min=4
        ),
    ] = 128,
    warm_start_families: Annotated[
        str,
        typer.Option(
            help="--learn: families the warm start imitates, comma-separated, or all "
            "(default: the warm start's own mix, 12 repo-gen, 12 repair, 96 terminal)"
        ),
    ] = "",
    warm_start_count: Annotated[
        int,
        typer.Option(help="--learn: instances of each family the warm start imitates (0: its mix)", min=0),
    ] = 0,
    warm_start_steps: Annotated[int, typer.Option(help="--learn: supervised warm-start steps", min=1)] = 70,
    learning_rate: Annotated[float, typer.Option(help="--learn: the trainer's learning rate", min=0)] = 2e-4,
    temperature: Annotated[float, typer.Option(help="--learn: the agent's temperature", min=0)] = 0.7,
) -> None:
    """Run the end-to-end slice on the local stack and narrate it (`--learn`: a training run)."""
    if learn and quick:
        raise typer.BadParameter("choose one of --learn and --quick")
    if learn:
        from gyre_app.demo_learn import LearnConfig
        from gyre_app.demo_learn import main as learn_demo
        from gyre_app.stack import MODES

        if mode not in MODES:
            raise typer.BadParameter(f"--mode: one of {', '.join(MODES)}, got {mode!r}")
        from gyre_app.warmstart.build import WarmStartConfig, each
        from services.evaluator.generate.families import parse_families

        fams = parse_families(families)
        num_train, num_heldout = len(fams) * (count - count // 4), len(fams) * (count // 4)
        if num_train < train_pool or num_heldout < heldout:
            raise typer.BadParameter(
                f"--count {count} of {len(fams)} families gives {num_train} training and {num_heldout} "
                f"held-out instances (every 4th held out); --train-pool {train_pool} and --heldout "
                f"{heldout} need more"
            )
        if 0 < warm_start_count < 4:
            raise typer.BadParameter(
                f"--warm-start-count: 0 (the default mix) or at least 4, got {warm_start_count}"
            )
        warm = WarmStartConfig()
        if warm_start_families or warm_start_count:
            names = parse_families(warm_start_families or "all")
            warm = dataclasses.replace(warm, counts=each(names, warm_start_count or 48))
        from gyre_app.learn_probe import ProbeProtocol

        config = LearnConfig(
            steps=steps,
            groups_per_step=groups_per_step,
            train_pool=train_pool,
            heldout=heldout,
            probe=ProbeProtocol(samples=probe_samples, temperature=temperature),
            group_size=group_size,
            timeout_s=timeout_s,
            mode=mode,
            families=tuple(parse_families(families)),
            learning_rate=learning_rate,
            temperature=temperature,
            count_per_family=count,
            warm_start=dataclasses.replace(
                warm, train=dataclasses.replace(warm.train, steps=warm_start_steps)
            ),
        )
        code = learn_demo(KernelSettings(), config, keep=keep)
    else:
        from gyre_app.demo import main as run_demo

        code = run_demo(KernelSettings(), keep=keep)
    if code:
        raise typer.Exit(code)


cli_tasks.register(app)
cli_status.register(app)
cli_dead_letters.register(app)
cli_replay.register(app)
cli_trace.register(app)
cli_report.register(app)
cli_export.register(app)
cli_track.register(app)
cli_images.register(app)
cli_cells.register(app)

# Commands that belong to a service live in that service and are loaded only when named, so
# `gyre up` does not pay for torch. Each module has `main(argv: list[str]) -> int`; its own
# parser answers `--help`.
SERVICE_COMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("gyre_app.emulation.sim_command", "Simulate the scheduling modes on a workload file."),
    "trajectory": ("services.trajectory.cli", "Import call records, print replayed samples, rebuild trees."),
    "model": ("services.engine.cli", "Create a tiny local model checkpoint."),
    "evaluate": ("services.evaluator.cli", "Grade one workspace offline."),
}


def _service_command(name: str, summary: str) -> None:
    @app.command(
        name=name,
        help=summary + " (`gyre " + name + " --help` for its options)",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )
    def forward(ctx: typer.Context) -> None:
        code = _run_service_command(name, list(ctx.args))
        if code:
            raise typer.Exit(code)


for _name, (_, _summary) in SERVICE_COMMANDS.items():
    _service_command(_name, _summary)


def _run_service_command(name: str, argv: list[str]) -> int:
    return _run_module(SERVICE_COMMANDS[name][0], argv)


def _run_module(module_name: str, argv: list[str]) -> int:
    return int(importlib.import_module(module_name).main(argv))


def command_path(argv: list[str]) -> str:
    """The (sub)command words of argv. Example: ["replay", "step", "9", "--json"] -> "replay step"."""
    command: Any = typer.main.get_command(app)
    words = []
    for arg in argv:
        subcommands = getattr(command, "commands", {})
        if arg not in subcommands:
            break
        words.append(arg)
        command = subcommands[arg]
    return " ".join(words)


def _present_stack_certificate() -> None:
    """A `gyre up --secure` stack's services take only certified clients: be one of them."""
    from gyre.devstack.processes import read_json
    from gyre.settings import stack_state_path
    from gyre_app.secure import use_tls_env

    tls = (read_json(stack_state_path(KernelSettings().state_dir)) or {}).get("tls")
    use_tls_env({f"GYRE_TLS_{k.upper()}": v for k, v in tls.items()} if isinstance(tls, dict) else {})


def one_line(message: str) -> str:
    """An error message as one line: a newline becomes a space; any other character that is not
    printable (a tab, U+001E or U+2028 from a tasks file, which end lines too) is escaped.

    Example: one_line("line 1, field a\x1eb: unknown") -> "line 1, field a\\x1eb: unknown"
    """
    message = message.replace("\n", " ")
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in message)


def _is_utf8(arg: str) -> bool:
    try:
        arg.encode()
    except UnicodeEncodeError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    # `gyre up/down` fork servers after gRPC calls; grpc's fork handlers are not needed for that.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    argv = sys.argv[1:] if argv is None else argv
    kernel = KernelSettings()
    # The command's own output is stdout (scripts parse it); what a library logs meanwhile (a
    # sandbox root relocated while `gyre down` sweeps, say) goes to stderr.
    configure_logging(fmt=kernel.log_format, level=kernel.log_level)
    _present_stack_certificate()
    undecodable = next((arg for arg in argv if not _is_utf8(arg)), None)
    if undecodable is not None:  # bytes the locale could not decode: no service could take them
        print(one_line(f"gyre {command_path(argv)}: {undecodable!r} is not UTF-8 text"), file=sys.stderr)
        return INPUT_ERROR
    if argv[:1] == ["model"] and "--warm-start" in argv:  # the warm start needs every service's parts
        from gyre_app.warmstart.cli import main as warm_start

        return warm_start(argv[1:])
    if argv[:2] == ["tasks", "generate"]:  # the evaluator's task-set generator has its own parser
        return _run_module("services.evaluator.generate.cli", argv[1:])
    if argv and argv[0] in SERVICE_COMMANDS:
        return _run_service_command(argv[0], argv[1:])
    command = command_path(argv)
    try:
        result = app(argv, prog_name="gyre", standalone_mode=False)
    except typer.Exit as exc:
        return int(exc.exit_code)
    except typer.Abort:
        print(f"gyre {command}: aborted", file=sys.stderr)
        return 1
    except TyperException as exc:  # usage errors (click's): one line, like every input error
        message = exc.format_message()  # type: ignore[attr-defined]
        print(one_line(f"gyre {command}: {message} (gyre {command} --help)"), file=sys.stderr)
        return INPUT_ERROR
    except (InvalidArgument, TasksFileError) as exc:
        print(one_line(f"gyre {command}: {exc}"), file=sys.stderr)
        return INPUT_ERROR
    except (GyreError, RuntimeError) as exc:
        print(one_line(f"gyre {command}: {exc}"), file=sys.stderr)
        return 1
    return int(result) if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
