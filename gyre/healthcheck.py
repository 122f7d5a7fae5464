"""`python -m gyre.healthcheck ADDRESS [SERVICE]`: one gRPC health check, for container probes (shell).

Exits 0 when the server at ADDRESS answers SERVING for SERVICE (default "", the whole server),
1 otherwise, with one line on stderr saying what it got. Compose health checks and any probe
that runs a command use it; it needs nothing but the image's Python.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gyre.tls import sync_channel


def check(address: str, *, service: str = "", timeout_s: float = 3.0) -> str | None:
    """None when SERVING; otherwise why not (the status, or the RPC error)."""
    with sync_channel(address) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s
            )
        except grpc.RpcError as exc:
            return f"{exc.code().name}: {exc.details()}"  # type: ignore[attr-defined]
    if answer.status != health_pb2.HealthCheckResponse.SERVING:
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre.healthcheck", description=__doc__.splitlines()[0])
    parser.add_argument("address", help="HOST:PORT of a Gyre gRPC server")
    parser.add_argument("service", nargs="?", default="", help="gRPC service name; default the whole server")
    parser.add_argument("--timeout-s", type=float, default=3.0)
    ns = parser.parse_args(argv)
    problem = check(ns.address, service=ns.service, timeout_s=ns.timeout_s)
    if problem is not None:
        print(f"{ns.address}: not serving ({problem})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
