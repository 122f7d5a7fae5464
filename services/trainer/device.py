"""Where and in what precision the trainer computes: device placement, bf16 autocast, DP backend (torch).

One `DevicePlan` travels from configuration to every place that makes tensors: the model is
moved to `device`, forward passes run under bf16 autocast when asked (master weights, gradients
and the float64 reductions stay in float32/float64), and the data-parallel process groups use
NCCL when the device is CUDA, gloo otherwise.

What ran where: the CPU paths (gloo, CPU bf16 autocast) run in the tests on every machine. The
CUDA paths (a CUDA device, NCCL groups) are written to the same interfaces but have not run on
a GPU yet; their tests are marked `gpu` and skipped, with the reason, where no CUDA device exists.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
from transformers import PreTrainedModel


@dataclass(frozen=True, slots=True, kw_only=True)
class DevicePlan:
    device: str = "cpu"
    """A torch device name: cpu, cuda, cuda:1."""
    autocast_bf16: bool = False
    """Run forward passes under bf16 autocast (attention and the loss accumulate in float32)."""

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def backend(self) -> str:
        """The collective backend of the data-parallel groups: NCCL on CUDA, gloo elsewhere."""
        return "nccl" if self.torch_device.type == "cuda" else "gloo"


def check_device(plan: DevicePlan) -> None:
    """Refuse a device this machine does not have, naming it (before any weights move)."""
    device = plan.torch_device
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {plan.device!r}: torch sees no CUDA device on this machine")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {plan.device!r}: this machine has {torch.cuda.device_count()} CUDA devices"
            )
    elif device.type != "cpu":
        raise ValueError(f"device {plan.device!r}: only cpu and cuda[:N] are supported")


def place(model: PreTrainedModel, plan: DevicePlan) -> PreTrainedModel:
    """The model on the plan's device (float32 master weights stay float32)."""
    moved: PreTrainedModel = cast(Any, model).to(plan.torch_device)
    return moved


@contextlib.contextmanager
def autocast(plan: DevicePlan) -> Iterator[None]:
    """bf16 autocast on the plan's device type when the plan asks for it, else nothing."""
    with torch.autocast(plan.torch_device.type, dtype=torch.bfloat16, enabled=plan.autocast_bf16):
        yield
