"""The engine port's contract, run against every adapter: torch here, vLLM wherever a GPU is.

Token ids in prompts are arbitrary ids of the tiny model's vocabulary; expectations come from
`transformers` itself (generate, and a fresh full forward pass), never from the engine under test.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch
from transformers import AutoModelForCausalLM

from gyre.errors import InvalidArgument, NotFound
from services.engine.main import build_backend
from services.engine.port import EngineBackend
from services.engine.sampling import Sampling
from services.engine.sequence import Emission, Finish
from tests.engine.conftest import engine_settings

PROMPTS = [[1, 89, 95, 444, 205], [1, 419, 205, 78, 79, 2, 205, 1, 298, 358, 205], [7, 8, 9]]


def vllm_unavailable_reason() -> str | None:
    if not torch.cuda.is_available():
        return "vLLM adapter needs a CUDA device; none on this machine"
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (pip install -e '.[vllm]')"
    return None


@pytest_asyncio.fixture(
    scope="module",
    loop_scope="session",
    params=["torch", pytest.param("vllm", marks=pytest.mark.gpu)],
)
async def backend(request: pytest.FixtureRequest, model_dir: Path) -> AsyncIterator[EngineBackend]:
    if request.param == "vllm" and (reason := vllm_unavailable_reason()) is not None:
        pytest.skip(reason)
    settings = engine_settings(model_dir, f"contract-{request.param}", adapter=request.param)
    engine = await asyncio.to_thread(build_backend, settings)
    stop = asyncio.Event()
    task = asyncio.create_task(engine.run(stop))
    yield engine
    stop.set()
    await task


@pytest.fixture(scope="session")
def reference(model_dir: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None)
    return [int(t) for t in out[0, len(prompt) :]]


async def collect(stream: Any) -> tuple[list[int], list[float], list[int], Finish | None]:
    ids: list[int] = []
    lps: list[float] = []
    versions: list[int] = []
    finish = None
    piece: Emission
    async for piece in stream:
        ids += piece.token_ids
        lps += piece.logprobs
        versions += piece.policy_versions
        finish = piece.finish
    return ids, lps, versions, finish


async def test_concurrent_greedy_generations_equal_transformers_generate(
    backend: EngineBackend, reference: Any
) -> None:
    streams = [
        await backend.generate(
            request_id=f"greedy-{i}", execution_id=f"x{i}", prompt_ids=p, sampling=Sampling(max_tokens=12)
        )
        for i, p in enumerate(PROMPTS)
    ]
    results = await asyncio.gather(*(collect(s) for s in streams))
    for prompt, (ids, _, _, finish) in zip(PROMPTS, results, strict=True):
        expected = hf_greedy(reference, prompt, 12)
        assert ids == expected[: len(ids)]
        assert finish in (Finish.LENGTH, Finish.STOP)
        assert len(ids) == 12 or finish is Finish.STOP


async def test_requests_join_a_running_batch_and_still_match(backend: EngineBackend, reference: Any) -> None:
    long = await backend.generate(
        request_id="join-long", execution_id="", prompt_ids=PROMPTS[0], sampling=Sampling(max_tokens=30)
    )
    pieces = aiter(long)
    first = await anext(pieces)
    late = await backend.generate(
        request_id="join-late", execution_id="", prompt_ids=PROMPTS[2], sampling=Sampling(max_tokens=10)
    )
    rest, late_out = await asyncio.gather(collect(pieces), collect(late))
    assert list(first.token_ids) + rest[0] == hf_greedy(reference, PROMPTS[0], 30)
    assert late_out[0] == hf_greedy(reference, PROMPTS[2], 10)


async def test_logprobs_match_a_fresh_full_forward(backend: EngineBackend, reference: Any) -> None:
    prompt = PROMPTS[1]
    stream = await backend.generate(
        request_id="lp-1",
        execution_id="",
        prompt_ids=prompt,
        sampling=Sampling(temperature=1.0, top_p=0.9, max_tokens=16, seed=7),
    )
    ids, lps, versions, _ = await collect(stream)
    with torch.inference_mode():
        logprobs_TV = torch.log_softmax(reference(torch.tensor([prompt + ids])).logits[0].float(), dim=-1)
    expected = [float(logprobs_TV[len(prompt) - 1 + i, t]) for i, t in enumerate(ids)]
    assert max(abs(a - b) for a, b in zip(lps, expected, strict=True)) < 1e-4
    assert set(versions) == {backend.stats().policy_version}


async def test_seeded_sampling_repeats_and_differs_from_greedy(backend: EngineBackend) -> None:
    runs = []
    for i, sampling in enumerate(
        [Sampling(temperature=1.0, max_tokens=16, seed=3)] * 2 + [Sampling(max_tokens=16)]
    ):
        stream = await backend.generate(
            request_id=f"seed-{i}", execution_id="", prompt_ids=PROMPTS[2], sampling=sampling
        )
        runs.append((await collect(stream))[0])
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


async def test_stop_id_ends_the_generation_with_the_stop_token(
    backend: EngineBackend, reference: Any
) -> None:
    expected = hf_greedy(reference, PROMPTS[0], 8)
    stop = expected[3]
    stream = await backend.generate(
        request_id="stop-1",
        execution_id="",
        prompt_ids=PROMPTS[0],
        sampling=Sampling(max_tokens=8, stop_ids=frozenset({stop})),
    )
    ids, _, _, finish = await collect(stream)
    assert finish is Finish.STOP
    assert ids == expected[: expected.index(stop) + 1]


async def test_pause_then_resume_continues_token_for_token(backend: EngineBackend, reference: Any) -> None:
    stream = await backend.generate(
        request_id="pr-1", execution_id="", prompt_ids=PROMPTS[1], sampling=Sampling(max_tokens=40)
    )
    pieces = aiter(stream)
    await anext(pieces)
    paused = await backend.pause("pr-1")
    before = await collect(pieces)
    assert before[3] is Finish.PAUSED
    resumed = await collect(await backend.resume("pr-1"))
    assert list(paused.output.token_ids) + resumed[0] == hf_greedy(reference, PROMPTS[1], 40)
    assert resumed[3] is Finish.LENGTH


async def test_bad_input_is_refused_naming_the_field_and_the_engine_keeps_serving(
    backend: EngineBackend, reference: Any
) -> None:
    vocab = reference.config.vocab_size
    window = reference.config.max_position_embeddings
    cases: list[tuple[list[int], Sampling, str]] = [
        ([1, vocab], Sampling(max_tokens=4), "prompt_ids[1]"),
        ([1, -3], Sampling(max_tokens=4), "prompt_ids[1]"),
        ([1, 2], Sampling(max_tokens=0), "sampling.max_tokens"),
        ([1] * window, Sampling(max_tokens=4), "prompt_ids"),
        ([], Sampling(max_tokens=4), "prompt_ids"),
        ([1, 2], Sampling(max_tokens=4, top_p=1.5), "sampling.top_p"),
    ]
    for i, (prompt, sampling, field) in enumerate(cases):
        with pytest.raises(InvalidArgument) as refused:
            await backend.generate(
                request_id=f"bad-{i}", execution_id="", prompt_ids=prompt, sampling=sampling
            )
        assert refused.value.field == field
    for call in (backend.pause, backend.resume, backend.cancel):
        with pytest.raises(NotFound):
            await call("no-such-generation")
    ids, *_ = await collect(
        await backend.generate(
            request_id="after-bad", execution_id="", prompt_ids=PROMPTS[2], sampling=Sampling(max_tokens=5)
        )
    )
    assert ids == hf_greedy(reference, PROMPTS[2], 5)
