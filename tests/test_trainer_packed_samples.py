"""Samples as packed arrays (`PackedSamples`): round trips, refusals that name what is wrong, bad batches."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from trainer_builders import tiny_model, tree_samples

from gyre.errors import InvalidArgument
from gyre.trajectory.v1 import trajectory_pb2
from services.trainer.dp import DataParallelCore
from services.trainer.loss import LossConfig
from services.trainer.microbatch import (
    MicrobatchTooLarge,
    decode_microbatch,
    encode_microbatch,
    parameters_vector,
    plan_microbatches,
)
from services.trainer.sample_arrays import PackedSamplesInvalid, decode_samples, encode_samples
from services.trainer.samples import Sample
from services.trainer.source import samples_from_response
from services.trainer.steps import OptimConfig, PolicyTrainer, make_optimizer
from services.trajectory import weights as trajectory_weights
from services.trajectory.messages import samples_to_packed


def float32_exact(samples: list[Sample]) -> list[Sample]:
    """Weights and logprobs rounded to float32, the precision the contract carries them in."""
    return [
        dataclasses.replace(
            s,
            token_weight=tuple(np.float32(s.token_weight).tolist()),
            old_logprobs=tuple(np.float32(s.old_logprobs).tolist()),
        )
        for s in samples
    ]


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    return float32_exact(tree_samples(tiny_model(), num_executions=2))


def test_a_microbatch_survives_the_trip_to_a_satellite_unchanged(samples: list[Sample]) -> None:
    assert decode_microbatch(encode_microbatch(samples)) == tuple(samples)


def test_a_payload_of_another_format_version_is_refused(samples: list[Sample]) -> None:
    packed = encode_samples(samples)
    packed.format_version = 2
    with pytest.raises(PackedSamplesInvalid, match=r"packed.format_version: is 2, this trainer reads 1"):
        decode_samples(packed)


def test_a_flipped_byte_fails_the_checksum(samples: list[Sample]) -> None:
    packed = encode_samples(samples)
    damaged = bytearray(packed.token_ids)
    damaged[5] ^= 0x01
    packed.token_ids = bytes(damaged)
    with pytest.raises(PackedSamplesInvalid, match=r"packed.crc32: is 0x[0-9a-f]{8}, the arrays hash to"):
        decode_samples(packed)


def test_token_arrays_of_different_lengths_are_refused_with_their_sizes(samples: list[Sample]) -> None:
    packed = encode_samples(samples)
    packed.loss_mask = packed.loss_mask[:-1]
    total = sum(len(s.token_ids) for s in samples)
    with pytest.raises(
        PackedSamplesInvalid,
        match=rf"packed.loss_mask: has {total - 1} bytes, expected {total} \({total} tokens",
    ):
        decode_samples(packed)


def test_per_sample_lists_of_different_lengths_are_refused(samples: list[Sample]) -> None:
    packed = encode_samples(samples)
    packed.rewards.pop()
    with pytest.raises(PackedSamplesInvalid, match=rf"packed.rewards: has {len(samples) - 1} entries"):
        decode_samples(packed)


def test_bytes_that_are_no_packed_samples_are_refused() -> None:
    with pytest.raises(PackedSamplesInvalid, match="microbatch: is not a PackedSamples message"):
        decode_microbatch(b"\xff\xff\xff")


def test_the_trajectory_services_packed_stream_decodes_to_its_samples() -> None:
    replayed = trajectory_weights.Sample(
        execution_id="e1",
        trajectory_id="e1/0",
        agent_role="main",
        token_ids=np.array([1, 2, 100, 101], np.int32),
        loss_mask=np.array([False, False, True, True]),
        token_weight=np.array([0, 0, 0.25, 0.25], np.float32),
        old_logprobs=np.array([0, 0, -0.5, -1.5], np.float32),
        policy_versions=np.array([0, 0, 3, 3], np.int64),
        reward=1.0,
        advantage=0.5,
        task_id="t1",
        has_reward=True,
    )
    messages = list(samples_to_packed([replayed, replayed, replayed], max_tokens=8))
    assert [len(m.num_tokens) for m in messages] == [2, 1]  # whole samples, at most 8 tokens a message
    decoded = [
        s
        for m in messages
        for s in samples_from_response(trajectory_pb2.StreamSamplesResponse(packed=m), index=0)
    ]
    assert decoded[2] == Sample(
        execution_id="e1",
        trajectory_id="e1/0",
        agent_role="main",
        token_ids=(1, 2, 100, 101),
        loss_mask=(False, False, True, True),
        token_weight=(0.0, 0.0, 0.25, 0.25),
        old_logprobs=(0.0, 0.0, -0.5, -1.5),
        policy_versions=(0, 0, 3, 3),
        reward=1.0,
        advantage=0.5,
    )


def test_a_trajectory_over_the_microbatch_budget_is_refused_with_the_sizes(samples: list[Sample]) -> None:
    with pytest.raises(
        MicrobatchTooLarge, match=r"exec-0/traj-0 has 52 tokens, more than the 40 a microbatch"
    ):
        plan_microbatches(samples, max_tokens=40)


@pytest.fixture
def trainer() -> PolicyTrainer:
    model = tiny_model()
    model.config.max_position_embeddings = 48  # shorter than the 52-token samples
    core = DataParallelCore(model_config=model.config, loss_config=LossConfig(), timeout_s=30)
    return PolicyTrainer(model, make_optimizer(model, OptimConfig()), OptimConfig(), core, version=0)


def assert_nothing_trained(trainer: PolicyTrainer, before: torch.Tensor) -> None:
    assert trainer.version == 0
    assert torch.equal(parameters_vector(trainer.model), before)


def test_a_tree_deeper_than_the_context_refuses_the_whole_step(
    trainer: PolicyTrainer, samples: list[Sample]
) -> None:
    before = parameters_vector(trainer.model).clone()
    with pytest.raises(
        InvalidArgument, match=r"samples\[0\].token_ids: trajectory exec-0/traj-0 is 52 tokens deep"
    ):
        trainer.step(samples)
    assert_nothing_trained(trainer, before)


def test_a_sample_with_disagreeing_arrays_refuses_the_whole_step(
    trainer: PolicyTrainer, samples: list[Sample]
) -> None:
    trainer.model.config.max_position_embeddings = 4096
    bad = dataclasses.replace(samples[-1], old_logprobs=samples[-1].old_logprobs[:-1])
    before = parameters_vector(trainer.model).clone()
    with pytest.raises(InvalidArgument, match=r"samples\[5\].old_logprobs: has 51 entries for 52 tokens"):
        trainer.step([*samples[:-1], bad])
    assert_nothing_trained(trainer, before)
