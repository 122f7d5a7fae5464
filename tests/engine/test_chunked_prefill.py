"""Chunked prefill in the torch engine: a long prompt is prefilled a chunk per step while the
running generations keep decoding, and what it generates equals a one-shot prefill's output.

The engine core is driven step by step here (the loop calls `step` once per lock hold), so the
tests assert the order of events, not how long anything took.
"""

from __future__ import annotations

import math
from pathlib import Path

from services.engine.sampling import Sampling
from services.engine.sequence import Status
from services.engine.torch_engine import TorchEngine

CHUNK = 64
LONG = [(i * 7919) % 480 + 12 for i in range(600)]
SHORT = [101, 202, 303, 44, 55]


def greedy(n: int) -> Sampling:
    return Sampling(temperature=0.0, max_tokens=n)


def finish(engine: TorchEngine) -> None:
    for _ in range(1000):  # bounded: one chunk or one token a step
        if not engine.has_work():
            return
        engine.step()
    raise AssertionError("the engine still has work after 1000 steps")


def run_alone(engine: TorchEngine, request_id: str, prompt: list[int], n: int) -> list[int]:
    engine.submit(request_id=request_id, execution_id="", prompt_ids=prompt, sampling=greedy(n))
    finish(engine)
    return engine.get(request_id).output_ids


def test_a_chunk_prefilled_prompt_generates_what_a_one_shot_prefill_generates(model_dir: Path) -> None:
    chunked = TorchEngine(model_dir, engine_id="chunked", prefill_chunk_tokens=CHUNK)
    one_shot = TorchEngine(model_dir, engine_id="one-shot", prefill_chunk_tokens=len(LONG))
    chunked.submit(request_id="r", execution_id="", prompt_ids=LONG, sampling=greedy(12))
    steps_before_first_token = next(i for i in range(100) if chunked.step())  # bounded
    assert steps_before_first_token == math.ceil((len(LONG) - 1) / CHUNK) - 1
    assert chunked.num_prefill_tokens == len(LONG) - 1
    finish(chunked)
    expected = run_alone(one_shot, "r", LONG, 12)
    assert one_shot.num_prefill_tokens == len(LONG) - 1
    assert chunked.get("r").output_ids == expected
    assert len(expected) == 12 and len(set(expected)) > 1


def test_a_running_generation_decodes_a_token_every_step_while_a_long_prompt_prefills(
    model_dir: Path,
) -> None:
    engine = TorchEngine(model_dir, engine_id="busy", prefill_chunk_tokens=CHUNK)
    alone = TorchEngine(model_dir, engine_id="alone", prefill_chunk_tokens=CHUNK)
    engine.eos_ids = alone.eos_ids = frozenset()  # generations end at max_tokens only
    engine.submit(request_id="short", execution_id="", prompt_ids=SHORT, sampling=greedy(40))
    assert [e.request_id for e in engine.step()] == ["short"]
    engine.submit(request_id="long", execution_id="", prompt_ids=LONG, sampling=greedy(4))
    long = engine.get("long")
    cached = [long.num_cached]
    emitted: list[str] = []
    for _ in range(100):  # bounded: one chunk a step
        emitted = [e.request_id for e in engine.step()]
        cached.append(long.num_cached)
        if long.status is not Status.WAITING:
            break
        assert emitted == ["short"]  # the prefilling prompt holds nobody back
    # One chunk a step; the step that caches the prompt's rest also decodes its first token.
    steps = math.ceil((len(LONG) - 1) / CHUNK)
    assert cached == [i * CHUNK for i in range(steps)] + [len(LONG)]
    assert sorted(emitted) == ["long", "short"]
    assert len(engine.get("short").output_ids) == 1 + steps
    finish(engine)
    assert engine.get("short").output_ids == run_alone(alone, "short", SHORT, 40)


def test_a_generation_paused_mid_prefill_moves_and_finishes_as_if_never_paused(model_dir: Path) -> None:
    """A drain pauses whatever is in flight, a half-prefilled prompt too: its KV covers the
    chunks done so far, moves like any other, and the destination prefills the rest."""
    source = TorchEngine(model_dir, engine_id="source", prefill_chunk_tokens=CHUNK)
    target = TorchEngine(model_dir, engine_id="target", prefill_chunk_tokens=CHUNK)
    source.submit(request_id="m", execution_id="e", prompt_ids=LONG, sampling=greedy(10))
    for _ in range(3):
        assert source.step() == []
    source.pause("m")
    header, data = source.export_kv("m")
    assert header.num_cached_tokens == 3 * CHUNK
    target.import_kv(header, data)
    target.resume("m")
    finish(target)
    assert target.num_prefill_tokens == len(LONG) - 1 - 3 * CHUNK
    assert target.get("m").output_ids == run_alone(
        TorchEngine(model_dir, engine_id="whole", prefill_chunk_tokens=len(LONG)), "m", LONG, 10
    )
