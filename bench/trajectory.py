"""Trajectory processor throughput and storage on 1M-token synthetic executions.

    python -m bench.trajectory [--json] [--executions N] [--tokens T]

- ingest_tokens_per_s: new (unique) tokens per second from serialized `LlmCallRecorded` envelopes
  to committed Postgres rows: envelope parse, payload unpack, validation, tree placement,
  compression, inbox claim, COPY and commit, in the consumer's batches of 64 (NATS fetch excluded).
- replay_tokens_per_s: sample tokens per second, replaying all the executions as one batch (one
  group, as the trainer asks for it) with J_max=5, from a cold start: each timed iteration opens
  a new session and a new CallLog (no cached trees, nothing kept between iterations) and times
  `load_samples` whole: read the trajectories and tree_calls projections, lay out the segments,
  read and decompress the blobs of the calls on the selected paths, assemble the samples (ids,
  loss mask, weights, old logprobs, versions) and read rewards/advantages. REPLAY_ITERATIONS
  iterations; the figure is their total tokens over their total time. Protobuf encoding of the
  samples is excluded (reported apart as grpc_encode_tokens_per_s). Postgres' own buffer cache
  is as ingest left it (warm); the service keeps nothing. replay_batch_ms lists each iteration;
  replay_one_execution_tokens_per_s is the same measure with one execution per call.
- stored_bytes_per_unique_token: pg_total_relation_size (heap + TOAST + indexes) of the call log,
  execution headers, trajectories and tree_calls projections and inbox rows, over unique tree
  tokens. The call log holds token ids, the old log-probabilities and per-token policy versions
  of every call.
- flat_to_unique_token_ratio: sum over calls of prompt + output tokens, over unique tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid

import asyncpg

from gyre.db.engine import libpq_url, make_engine, make_sessionmaker, with_database
from gyre.db.inbox import apply_batch
from gyre.events import new_event, parse_envelope, type_map, unpack_payload
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.settle import Fate
from gyre_app.migrations import upgrade
from services.trajectory.call_events import CALLS_CONSUMER, CallEvents
from services.trajectory.call_log import CallLog
from services.trajectory.messages import record_to_proto, sample_to_proto
from services.trajectory.replay import load_samples
from services.trajectory.synthetic import SyntheticConfig, generate_execution, token_entropy_bits
from services.trajectory.weights import Sample

TYPES = type_map([proxy_events.LlmCallRecorded])
BATCH = 64
REPLAY_ITERATIONS = 3
RANK = ("main", "sub", "summary")


async def run(num_executions: int, target_tokens: int) -> dict[str, object]:
    admin_url = os.environ.get("GYRE_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    name = f"gyre_bench_traj_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(libpq_url(admin_url))
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(admin_url, name)
    try:
        await asyncio.to_thread(upgrade, "trajectory", url)
        configs = [SyntheticConfig(seed=100 + i, target_tokens=target_tokens) for i in range(num_executions)]
        executions = [str(uuid.uuid4()) for _ in configs]
        envelopes: list[bytes] = []
        for e, config in zip(executions, configs, strict=True):
            for r in generate_execution(e, config=config):
                env = new_event(
                    proxy_events.LlmCallRecorded(call=record_to_proto(r)), producer="proxy", correlation_id=e
                )
                envelopes.append(env.SerializeToString())
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        calls = CallLog()
        call_events = CallEvents(sessions, calls)
        inbox = call_events.inbox()
        t0 = time.perf_counter()
        for i in range(0, len(envelopes), BATCH):
            events = []
            for data in envelopes[i : i + BATCH]:
                env = parse_envelope(data)
                decoded = unpack_payload(env, env.payload, TYPES)
                assert decoded is not None
                events.append(decoded)
            outcomes = await apply_batch(inbox, CALLS_CONSUMER, events)
            assert all(o.fate is Fate.APPLIED for o in outcomes), outcomes
        ingest_s = time.perf_counter() - t0

        pg = await asyncpg.connect(libpq_url(url))
        sizes = {
            t: await pg.fetchval("SELECT pg_total_relation_size($1::regclass)", f"trajectory.{t}")
            for t in ("calls", "executions", "trajectories", "tree_calls", "processed_messages")
        }
        unique, flat = (
            await pg.fetchrow(
                "SELECT sum(num_unique_tokens), sum(num_flat_tokens) FROM trajectory.executions"
            )
        ).values()
        await pg.close()

        async def replay(ids: list[str]) -> tuple[float, list[Sample]]:
            t0 = time.perf_counter()
            async with sessions() as session:
                samples = await load_samples(
                    session, CallLog(), execution_ids=ids, j_max=5, role_rank=RANK, estimator="grpo"
                )
            return time.perf_counter() - t0, samples

        replay_s, sample_tokens, iteration_ms = 0.0, 0, []
        for _ in range(REPLAY_ITERATIONS):
            dt, samples = await replay(executions)
            replay_s += dt
            iteration_ms.append(round(1000 * dt, 1))
            sample_tokens += sum(len(s.token_ids) for s in samples)
        one_s, one_tokens = 0.0, 0
        for e in executions:
            dt, one = await replay([e])
            one_s += dt
            one_tokens += sum(len(s.token_ids) for s in one)
        t0 = time.perf_counter()
        for s in samples:
            sample_to_proto(s).SerializeToString()
        encode_s = time.perf_counter() - t0
        batch_tokens = sum(len(s.token_ids) for s in samples)
        await engine.dispose()
        return {
            "executions": num_executions,
            "calls": len(envelopes),
            "unique_tokens": int(unique),
            "flat_tokens": int(flat),
            "ingest_tokens_per_s": round(call_events.new_tokens / ingest_s),
            "replay_tokens_per_s": round(sample_tokens / replay_s),
            "replay_batch_sample_tokens": batch_tokens,
            "replay_batch_ms": iteration_ms,
            "replay_one_execution_tokens_per_s": round(one_tokens / one_s),
            "grpc_encode_tokens_per_s": round(batch_tokens / encode_s),
            "stored_bytes_per_unique_token": round(sum(sizes.values()) / int(unique), 3),
            "stored_bytes": sizes,
            "flat_to_unique_token_ratio": round(int(flat) / int(unique), 2),
            "synthetic_token_entropy_bits": round(token_entropy_bits(configs[0]), 2),
            "targets": {
                "ingest_tokens_per_s": 1_000_000,
                "replay_tokens_per_s": 5_000_000,
                "stored_bytes_per_unique_token": 4.8,
            },
        }
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object on the last line")
    parser.add_argument("--executions", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=1_000_000, help="unique tokens per execution")
    ns = parser.parse_args()
    result = asyncio.run(run(ns.executions, ns.tokens))
    if ns.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:34s} {v}")


if __name__ == "__main__":
    main()
