"""`python -m gyre_app.register`: route the proxy to one engine (shell).

The scheduler routes each satellite's engine itself as the cell's agent registers (`gyre up`
runs it that way); the compose stack, whose cells are not wired yet, still routes its one
engine with this command in its `register-engine` job. The request id names the address: a restarted
engine (new address) registers anew, a repeat of the same registration is answered from the first.
"""

from __future__ import annotations

import argparse
import sys

import grpc

from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from gyre.tls import sync_channel


def register_engine(proxy_address: str, *, cell_id: str, engine_id: str, address: str) -> None:
    with sync_channel(proxy_address) as channel:
        proxy_pb2_grpc.ProxyServiceStub(channel).RegisterEngine(
            proxy_pb2.RegisterEngineRequest(
                request_id=f"gyre-up:{cell_id}:{engine_id}:{address}",
                cell_id=cell_id,
                engine_id=engine_id,
                address=address,
            ),
            timeout=30.0,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre_app.register", description=__doc__.splitlines()[0])
    parser.add_argument("--proxy", required=True, help="the proxy's gRPC address, HOST:PORT")
    parser.add_argument("--cell", required=True, help="cell id, e.g. cell-0")
    parser.add_argument("--engine", required=True, help="engine id, e.g. engine-0")
    parser.add_argument("--address", required=True, help="the engine's gRPC address as the proxy reaches it")
    ns = parser.parse_args(argv)
    try:
        register_engine(ns.proxy, cell_id=ns.cell, engine_id=ns.engine, address=ns.address)
    except grpc.RpcError as exc:
        print(
            f"register {ns.engine} with the proxy at {ns.proxy}: {exc.code().name}: {exc.details()}",
            file=sys.stderr,
        )  # type: ignore[attr-defined]
        return 1
    print(f"registered {ns.engine} ({ns.cell}) at {ns.address} with the proxy at {ns.proxy}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
