"""`gyre trajectory import | samples | rebuild`: offline entry points on the database alone (shell).

    gyre trajectory import FILE.jsonl          store call records (DESIGN section 4 JSON, one a line)
    gyre trajectory samples --execution ID [--execution ID ...] [--j-max N] [--role-rank main,sub] --json
    gyre trajectory rebuild [--execution ID ...]   recompute the trajectories projection from the call log

The database is `GYRE_DATABASE_URL`, else the local stack's (`gyre up`). An import is one
transaction: a malformed line fails the command with its line number and reason and stores
nothing; importing the same file again changes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from gyre.db.engine import make_engine, make_sessionmaker
from gyre.db.migrate import upgrade
from gyre.errors import GyreError, InvalidArgument, Unavailable
from gyre.settings import KernelSettings, stack_state_path
from services.trajectory.call_log import CallLog, raw_connection, rebuild_projection
from services.trajectory.records import CallRecord, record_from_json
from services.trajectory.replay import load_samples
from services.trajectory.service import DEFAULT_J_MAX
from services.trajectory.tree import validate_role_rank
from services.trajectory.weights import GRPO, MEAN_CENTERED, Sample


def database_url(kernel: KernelSettings) -> str:
    if kernel.database_url:
        return kernel.database_url
    state = stack_state_path(kernel.state_dir)
    if state.exists():
        url = json.loads(state.read_text()).get("database_url")
        if url:
            return str(url)
    raise Unavailable(f"GYRE_DATABASE_URL unset and no local stack at {state}: run `gyre up`")


class ImportFailed(GyreError):
    pass


def parse_lines(path: Path) -> list[tuple[int, CallRecord]]:
    records = []
    with path.open() as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                records.append((number, record_from_json(json.loads(line))))
            except json.JSONDecodeError as exc:
                raise ImportFailed(f"{path}:{number}: not JSON: {exc.msg}") from exc
            except InvalidArgument as exc:
                raise ImportFailed(f"{path}:{number}: {exc}") from exc
    return records


async def import_file(url: str, path: Path) -> dict[str, int]:
    numbered = parse_lines(path)
    engine = make_engine(url)
    try:
        sessions = make_sessionmaker(engine)
        async with sessions() as session, session.begin():
            result = await CallLog().ingest(session, [r for _, r in numbered])
            if result.rejected:
                index, exc = min(result.rejected.items())
                raise ImportFailed(f"{path}:{numbered[index][0]}: {exc}")
    finally:
        await engine.dispose()
    return {"stored": result.stored, "duplicates": result.duplicates, "new_tokens": result.new_tokens}


def sample_json(s: Sample) -> dict[str, Any]:
    return {
        "execution_id": s.execution_id,
        "trajectory_id": s.trajectory_id,
        "agent_role": s.agent_role,
        "token_ids": s.token_ids.tolist(),
        "loss_mask": [int(x) for x in s.loss_mask],
        "token_weight": s.token_weight.tolist(),
        "old_logprobs": s.old_logprobs.tolist(),
        "policy_versions": s.policy_versions.tolist(),
        "reward": s.reward,
        "advantage": s.advantage,
    }


async def samples(url: str, ns: argparse.Namespace) -> list[Sample]:
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as session:
            return await load_samples(
                session,
                CallLog(),
                execution_ids=ns.execution,
                j_max=ns.j_max,
                role_rank=validate_role_rank([r for r in ns.role_rank.split(",") if r]),
                estimator=ns.advantage,
            )
    finally:
        await engine.dispose()


async def rebuild(url: str, execution_ids: list[str]) -> dict[str, int]:
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            pg = await raw_connection(session)
            ids = execution_ids or [
                r["execution_id"]
                for r in await pg.fetch("SELECT DISTINCT execution_id FROM trajectory.calls")
            ]
            out = {}
            for e in ids:
                tree = await rebuild_projection(pg, e)
                out[e] = len(tree.chains)
            return out
    finally:
        await engine.dispose()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gyre trajectory", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import", help="store call records from a JSON-lines file")
    imp.add_argument("file", type=Path)
    smp = sub.add_parser("samples", help="replay executions into loss-weighted samples")
    smp.add_argument("--execution", action="append", required=True, help="execution id (repeatable)")
    smp.add_argument("--j-max", type=int, default=DEFAULT_J_MAX, help="most trajectories per execution")
    smp.add_argument("--role-rank", default="main,sub,summary", help="selection order, comma-separated")
    smp.add_argument("--advantage", choices=[GRPO, MEAN_CENTERED], default=GRPO)
    smp.add_argument("--json", action="store_true", help='print {"samples": [...]} (the only output form)')
    reb = sub.add_parser("rebuild", help="recompute the trajectories projection from the call log")
    reb.add_argument("--execution", action="append", default=[], help="execution id (default: all)")
    return parser


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)
    try:
        url = database_url(KernelSettings())
        upgrade("trajectory", url, script_location=Path(__file__).with_name("migrations"))
        if ns.command == "import":
            if not ns.file.exists():
                raise ImportFailed(f"{ns.file}: no such file")
            print(json.dumps(asyncio.run(import_file(url, ns.file))))
        elif ns.command == "samples":
            print(json.dumps({"samples": [sample_json(s) for s in asyncio.run(samples(url, ns))]}))
        else:
            print(json.dumps({"rebuilt": asyncio.run(rebuild(url, ns.execution))}))
    except GyreError as exc:
        print(f"gyre trajectory {ns.command}: {exc}", file=sys.stderr)
        return 1
    return 0
