"""A service's `python -m <package>` entry: argument parsing, logging and the event loop (shell).

`--help` works with no server running: nothing connects before the arguments are parsed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic_settings import BaseSettings

from gyre.errors import GyreError
from gyre.logs import configure_logging
from gyre.metrics import serve_metrics
from gyre.runtime import ServiceHost
from gyre.settings import KernelSettings
from gyre.tracing import configure_tracing

S = TypeVar("S", bound=BaseSettings)

KERNEL_ENV_HELP = """environment:
  GYRE_NATS_URL        NATS with JetStream (unset: the local stack of `gyre up`)
  GYRE_DATABASE_URL    Postgres, SQLAlchemy URL (unset: the local stack of `gyre up`)
  GYRE_BUS_PREFIX      first token of subjects and stream names (default gyre)
  GYRE_LOG_FORMAT      console | json;  GYRE_LOG_LEVEL debug | info | warning | error
  GYRE_METRICS_PORT    serve Prometheus /metrics there (unset: off; 0: a free port, logged)
  GYRE_METRICS_HOST    where /metrics binds (default 127.0.0.1)
  GYRE_TRACE_EXPORTER  none | console (console needs opentelemetry-sdk, extra [otel])
"""


def launch(
    *,
    name: str,
    description: str,
    settings_cls: type[S],
    build: Callable[[S, KernelSettings], Awaitable[ServiceHost]],
    argv: list[str] | None = None,
) -> int:
    env_prefix = settings_cls.model_config.get("env_prefix", "")
    # The service's package is where its settings class lives: `<package>.config`.
    package = settings_cls.__module__.rpartition(".")[0] or name
    parser = argparse.ArgumentParser(
        prog=f"python -m {package}",
        description=description,
        epilog=f"{KERNEL_ENV_HELP}  {env_prefix}HOST / {env_prefix}PORT  where the gRPC server listens",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--host", help="address to bind (default from settings: 127.0.0.1)")
    parser.add_argument("--port", type=int, help="gRPC port; 0 picks a free one")
    ns = parser.parse_args(argv)
    overrides = {k: v for k, v in (("host", ns.host), ("port", ns.port)) if v is not None}
    settings = settings_cls(**overrides)
    kernel = KernelSettings()
    configure_logging(fmt=kernel.log_format, level=kernel.log_level)

    async def run() -> None:
        configure_tracing(kernel.trace_exporter)
        host = await build(settings, kernel)
        metrics = (
            await serve_metrics(kernel.metrics_host, kernel.metrics_port)
            if kernel.metrics_port is not None
            else None
        )
        try:
            await host.serve_forever()
        finally:
            if metrics is not None:
                await metrics.close()

    try:
        asyncio.run(run())
    except GyreError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 1
    return 0
