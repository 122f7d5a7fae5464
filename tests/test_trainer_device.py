"""Device placement, bf16 autocast and the collective backend; CUDA cases are `gpu` (skipped without one)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
from torch.distributed import TCPStore  # type: ignore[attr-defined]
from trainer_builders import tiny_model, tree_samples

from services.trainer.device import DevicePlan, check_device, place
from services.trainer.dp import make_group
from services.trainer.loss import LossConfig
from services.trainer.microbatch import microbatch_gradient

NO_CUDA = "needs a CUDA device; torch sees none on this machine"


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.cpu() - b.cpu()).abs().max() / b.cpu().abs().max())


def test_the_backend_follows_the_device() -> None:
    assert DevicePlan(device="cpu").backend == "gloo"
    assert DevicePlan(device="cuda:1").backend == "nccl"


def test_a_device_the_machine_lacks_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"device 'cuda:99': "):
        check_device(DevicePlan(device="cuda:99"))


def test_an_unknown_collective_backend_is_refused() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5))
    with pytest.raises(ValueError, match="backend must be gloo or nccl, got 'mpi'"):
        make_group(store, epoch=0, rank=0, size=1, timeout_s=5, backend="mpi")


def test_bf16_autocast_keeps_the_gradient_close_to_float32() -> None:
    model = tiny_model()
    microbatch = tree_samples(model, num_executions=2)  # advantages of +-0.5
    full = microbatch_gradient(model, microbatch, LossConfig())
    bf16 = microbatch_gradient(model, microbatch, LossConfig(), autocast_bf16=True)
    assert bf16.grad_P.dtype == torch.float64  # reductions stay float64 whatever the compute precision
    assert 0 < rel_diff(bf16.grad_P, full.grad_P) <= 5e-2  # bf16 really ran, and stayed close


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_packed_gradient_on_cuda_equals_the_cpu_one() -> None:
    cpu_model = tiny_model()
    microbatch = tree_samples(cpu_model, num_executions=2)
    on_cpu = microbatch_gradient(cpu_model, microbatch, LossConfig())
    cuda_model = place(tiny_model(), DevicePlan(device="cuda"))
    on_cuda = microbatch_gradient(cuda_model, microbatch, LossConfig())
    assert on_cuda.grad_P.device.type == "cuda"
    assert rel_diff(on_cuda.grad_P, on_cpu.grad_P) <= 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_a_one_member_nccl_group_reduces_on_the_device() -> None:
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    group = make_group(store, epoch=0, rank=0, size=1, timeout_s=30, backend="nccl")
    grad = torch.arange(4, dtype=torch.float64, device="cuda")
    group.allreduce([grad]).wait()
    assert grad.tolist() == [0.0, 1.0, 2.0, 3.0]
