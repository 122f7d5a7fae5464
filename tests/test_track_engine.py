"""Engine KV use and prefix hit rate in the tracker's row: the pure figures, then a real engine.

The live test starts a real torch engine (the tiny model), registers its cell on a real bus the
way the scheduler announces it, runs two generations that share a prompt (the second reuses the
first's prefix), and checks the row's figures against the engine's own `GetEngineStats`.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from gyre.bus import Bus
from gyre.common.v1 import ids_pb2
from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre.events import new_event
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2
from gyre.settings import KernelSettings
from gyre.tls import aio_channel
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre_app.track_config import TrackSettings
from gyre_app.track_follow import follow, sample_engines
from gyre_app.track_ledger import RunLedger
from gyre_app.track_rows import EngineSample, StepFacts, engine_figures


def sample(engine: str, used: int, prefill: int, hits: int, total: int = 100) -> EngineSample:
    return EngineSample(
        engine_id=engine,
        kv_tokens_used=used,
        kv_tokens_total=total,
        prefill_tokens=prefill,
        prefix_hit_tokens=hits,
    )


def step_facts(step: int) -> StepFacts:
    return StepFacts(
        step=step,
        task_ids=(),
        num_groups=1,
        num_samples=2,
        num_target_tokens=10,
        staleness_mean=0.0,
        staleness_max=0,
        num_dropped_stale=0,
        loss=0.0,
        grad_norm=0.0,
        duration_s=1.0,
    )


def test_kv_use_is_the_mean_and_max_share_over_every_sample_of_every_engine() -> None:
    figures = engine_figures([sample("a", 10, 0, 0), sample("a", 30, 0, 0), sample("b", 80, 0, 0)], {})
    assert figures["engine/kv_use"] == pytest.approx(0.4)
    assert figures["engine/kv_use_max"] == pytest.approx(0.8)
    assert "engine/prefix_hit_rate" not in figures  # no prompt positions: no rate, not a made-up 0


def test_prefix_hit_rate_counts_each_engines_growth_since_the_previous_row() -> None:
    baseline = {"a": sample("a", 0, 100, 0), "b": sample("b", 0, 50, 50)}
    now = [sample("a", 5, 110, 30), sample("a", 5, 130, 90), sample("b", 5, 60, 50)]
    # a: 30 computed, 90 reused; b: 10 computed, none reused -> 90 / 130
    assert engine_figures(now, baseline)["engine/prefix_hit_rate"] == pytest.approx(90 / 130)


def test_an_engine_that_restarted_or_is_new_counts_from_zero() -> None:
    baseline = {"a": sample("a", 0, 500, 400)}
    restarted = [sample("a", 0, 20, 60)]  # counters went back: its start is the new baseline
    assert engine_figures(restarted, baseline)["engine/prefix_hit_rate"] == pytest.approx(0.75)
    fresh = engine_figures([sample("new", 0, 30, 10)], baseline)
    assert fresh["engine/prefix_hit_rate"] == pytest.approx(0.25)


def test_no_sample_leaves_the_engine_figures_out_and_a_zero_sized_cache_counts_no_share() -> None:
    assert engine_figures([], {}) == {}
    assert "engine/kv_use" not in engine_figures([sample("a", 0, 10, 0, total=0)], {})


def test_the_ledger_moves_the_baseline_to_each_rows_last_samples() -> None:
    ledger = RunLedger()
    ledger.record_engine_samples([sample("a", 10, 100, 0), sample("a", 20, 100, 100)])
    first = ledger.complete_step(step_facts(1)).row.scalars
    assert first["engine/prefix_hit_rate"] == pytest.approx(0.5)
    assert first["engine/kv_use"] == pytest.approx(0.15)
    assert ledger.complete_step(step_facts(2)).row.scalars.keys().isdisjoint({"engine/kv_use"})
    ledger.record_engine_samples([sample("a", 0, 100, 300)])
    assert ledger.complete_step(step_facts(3)).row.scalars["engine/prefix_hit_rate"] == 1.0


@pytest.mark.asyncio(loop_scope="session")
async def test_the_live_tracker_samples_the_engines_the_cells_registered(
    own_bus: Bus, kernel: KernelSettings, tmp_path: Path
) -> None:
    from services.engine.config import EngineSettings
    from services.engine.main import build
    from services.engine.model_init import init_model

    model = init_model(tmp_path / "model", seed=1, hidden_size=32, num_layers=1)
    settings = EngineSettings(
        model_dir=model,
        engine_id="engine-kv",
        cell_id="cell-kv",
        num_threads=1,
        publish_events=False,
        init_model_if_missing=False,
    )
    host = await build(settings, kernel)
    await host.start()
    try:
        async with aio_channel(host.address) as channel:
            engine = engine_pb2_grpc.EngineServiceStub(channel)
            prompt = list(range(3, 40))  # long enough to fill whole cache blocks, reused the second time
            for _ in range(2):
                request = engine_pb2.GenerateTokensRequest(
                    request_id=f"g-{uuid.uuid4().hex[:8]}",
                    execution_id="e-kv",
                    prompt_ids=prompt,
                    sampling=engine_pb2.SamplingParams(temperature=0, top_p=1, max_tokens=2),
                )
                async for _ in engine.GenerateTokens(request):
                    pass
            stats = await engine.GetEngineStats(engine_pb2.GetEngineStatsRequest())
        cell = scheduler_pb2.Cell(cell_id="cell-kv", engine_id="engine-kv", engine_address=host.address)
        registered = scheduler_events.CellRegistered(cell=cell)
        await own_bus.publish(new_event(registered, producer="scheduler", correlation_id="cell-kv"))
        step = trainer_events.StepCompleted(version=ids_pb2.PolicyVersion(steps=1), num_groups_consumed=1)
        await own_bus.publish(new_event(step, producer="trainer", correlation_id="step-1"))
        polls: list[int] = []

        def once(_: list[int]) -> bool:
            polls.append(1)
            return len(polls) == 1

        result = await follow(
            own_bus,
            TrackSettings(run_name="kv", poll_s=0.1),
            tmp_path / "track",
            sinks=("jsonl",),
            tokenizer_dir=None,
            keep_going=once,
            engine_sampler=sample_engines,
        )
    finally:
        await host.stop(grace_s=1)
    assert result.steps == [1]
    (row,) = [json.loads(line) for line in (tmp_path / "track" / "steps.jsonl").read_text().splitlines()]
    hits, computed = stats.num_prefix_cache_hit_tokens, stats.num_prefill_tokens
    assert hits > 0, "the second generation reused no prefix: the figure would test nothing"
    assert row["engine/prefix_hit_rate"] == pytest.approx(hits / (hits + computed))
    used, total = stats.num_kv_cache_tokens_used, stats.num_kv_cache_tokens_total
    assert row["engine/kv_use"] == pytest.approx(used / total)
    assert await sample_engines(["127.0.0.1:1"]) == []  # an engine that does not answer is skipped
