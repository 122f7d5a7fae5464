"""`python -m services.trainer.satellite`: a satellite cell's training worker (shell).

It asks the trainer to join (`JoinStep`), connects to the rendezvous it is given, computes the
microbatches it takes and joins each reduction until the trainer releases it (`LeaveStep`).
`--rendezvous` skips the RPC, for a core running in-process (tests, benchmarks): the process
may start before its join and waits for a join not yet released. `--standby`
keeps a warm worker for a cell's agent: it reads one rendezvous URI per line on stdin (the
scheduler has already called `JoinStep`), answers `accepted <uri>`, trains until released and
answers `released <microbatches>`; it prints `ready` once its imports are done and ends at EOF.
"""

from __future__ import annotations

import argparse
import sys

import torch

from gyre.ids import new_uuid7
from gyre.tls import sync_channel
from gyre.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from services.trainer.dp import run_satellite


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.trainer.satellite", description=__doc__)
    parser.add_argument("--cell-id", required=True, help="this satellite cell's id, e.g. cell-3")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--trainer", help="trainer gRPC address host:port (asks JoinStep)")
    where.add_argument("--rendezvous", help="tcp://host:port of the core's store (already admitted)")
    where.add_argument("--standby", action="store_true", help="read rendezvous URIs from stdin, one a line")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--timeout-s", type=float, default=120.0)
    parser.add_argument(
        "--device", default="cpu", help="torch device: cpu, cuda, cuda:1 (NCCL groups on CUDA)"
    )
    ns = parser.parse_args(argv)
    torch.set_num_threads(ns.threads)
    if ns.standby:
        return _standby(ns.cell_id, timeout_s=ns.timeout_s, device=ns.device)
    rendezvous = ns.rendezvous
    if ns.trainer:
        with sync_channel(ns.trainer) as channel:
            answer = trainer_pb2_grpc.TrainerServiceStub(channel).JoinStep(
                trainer_pb2.JoinStepRequest(request_id=new_uuid7(), cell_id=ns.cell_id), timeout=ns.timeout_s
            )
        if not answer.admitted:
            print(f"satellite {ns.cell_id}: not admitted: {answer.reason}", file=sys.stderr)
            return 2
        rendezvous = answer.rendezvous_uri
    computed = run_satellite(
        rendezvous,
        cell_id=ns.cell_id,
        timeout_s=ns.timeout_s,
        device=ns.device,
        before_join=not ns.trainer,  # `--rendezvous`: the core may admit this cell after it starts
    )
    print(f"satellite {ns.cell_id}: released after {computed} microbatches", file=sys.stderr)
    return 0


def _standby(cell_id: str, *, timeout_s: float, device: str) -> int:
    print("ready", flush=True)
    for line in sys.stdin:
        rendezvous = line.strip()
        if not rendezvous.startswith("tcp://"):
            print(f"refused {rendezvous!r}: not a tcp:// rendezvous", flush=True)
            continue
        print(f"accepted {rendezvous}", flush=True)
        try:
            computed = run_satellite(rendezvous, cell_id=cell_id, timeout_s=timeout_s, device=device)
        except Exception as exc:  # a session that failed (a group that could not form): the core
            # counts this cell lost for that step; the worker stays warm for the next session
            print(f"satellite {cell_id}: session failed: {exc}", file=sys.stderr, flush=True)
            computed = 0
        print(f"released {computed}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
