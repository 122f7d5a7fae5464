"""Dynamic data parallelism: microbatches handed out as members ask, a gloo group per membership (shell).

The core cell hosts a `torch.distributed.TCPStore`. A step writes its microbatches there; every
member (the core included) takes the next one with an atomic `store.add`, so work goes to
whoever asks first. Membership is organised in *epochs*: each epoch has a fixed member list and
its own process group (`ProcessGroupGloo` on a `PrefixStore`, `ProcessGroupNCCL` on GPUs). A
satellite that asks to join mid-step makes the core close the epoch at its next microbatch
boundary: every member all-reduces the float64 sum of the gradients it computed in that epoch,
then the next epoch opens with the new member list and the core broadcasts the step's weights.
A leaving satellite finishes its microbatch, reduces, and is not in the next epoch.

Why the step gradient is the same whatever the membership: the loss is a weighted sum whose
weights are fixed for the whole batch (DESIGN section 4), so the step gradient is the sum of the
per-microbatch gradients; each microbatch is computed exactly once (the counter), in the same
weights, and the sums are taken in float64, so the partition only changes rounding far below
float32 resolution.

Store keys: `model/config`, `loss/config`; `epoch/latest`; `epoch/<k>` (JSON plan);
`epoch/<k>/end` (JSON {"next": k+1}); `step/<v>/mb/<i>`, `step/<v>/next`, `step/<v>/done`;
`count/<cell>`; `released/<cell>`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from datetime import timedelta

import structlog
import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, Store, TCPStore  # type: ignore[attr-defined]
from transformers import PretrainedConfig, PreTrainedModel, Qwen2Config

from services.trainer.loss import LossConfig
from services.trainer.microbatch import (
    decode_microbatch,
    encode_microbatch,
    load_parameters_vector,
    microbatch_gradient,
    parameters_vector,
)
from services.trainer.policy import build_model
from services.trainer.samples import Sample

log = structlog.get_logger(__name__)
POLL_S = 0.002


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochPlan:
    epoch: int
    version: int
    """The version the step being computed will produce."""
    members: tuple[str, ...]
    """Cell ids; the index is the rank, the core is rank 0."""
    num_microbatches: int

    def encode(self) -> str:
        return json.dumps({**asdict(self), "members": list(self.members)})

    @staticmethod
    def decode(data: bytes) -> EpochPlan:
        d = json.loads(data)
        return EpochPlan(
            epoch=d["epoch"],
            version=d["version"],
            members=tuple(d["members"]),
            num_microbatches=d["num_microbatches"],
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class JoinTicket:
    admitted: bool
    reason: str
    target_version: int
    dp_rank: int
    dp_world_size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaveResult:
    num_micro_batches_completed: int
    num_micro_batches_reassigned: int
    target_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class StepGradient:
    grad_P: torch.Tensor
    """float64 sum of every microbatch's gradient."""
    num_microbatches: int
    max_world_size: int
    num_targets: int
    loss: float


def make_group(store: Store, *, epoch: int, rank: int, size: int, timeout_s: float) -> dist.ProcessGroup:
    """The process group of one epoch; on GPUs this is where ProcessGroupNCCL would be built."""
    prefixed = PrefixStore(f"pg/{epoch}/", store)
    group: dist.ProcessGroup = dist.ProcessGroupGloo(prefixed, rank, size, timedelta(seconds=timeout_s))  # type: ignore[assignment]
    return group


def _wait_key(store: Store, key: str, *, deadline: float, also: Callable[[], bool] = lambda: False) -> bool:
    """Poll until `key` exists (True) or `also()` holds (False); TimeoutError past the deadline."""
    while not store.check([key]):
        if also():
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"store key {key!r} did not appear in time")
        time.sleep(POLL_S)
    return True


@dataclass(slots=True)
class _Membership:
    members: list[str]
    pending_joins: list[str] = field(default_factory=list)
    pending_leaves: dict[str, Future[LeaveResult]] = field(default_factory=dict)


class DataParallelCore:
    """The core cell's side: owns the store, the member list and the reductions."""

    def __init__(
        self,
        *,
        model_config: PretrainedConfig,
        loss_config: LossConfig,
        host: str = "127.0.0.1",
        port: int = 0,
        cell_id: str = "cell-0",
        timeout_s: float = 60.0,
        packed: bool = True,
    ) -> None:
        self.host = host
        self.cell_id = cell_id
        self.timeout_s = timeout_s
        self.loss_config = loss_config
        self.packed = packed
        self.store = TCPStore(
            host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
        )
        self.port = self.store.port
        self.store.set("model/config", model_config.to_json_string())
        self.store.set("loss/config", json.dumps({**asdict(loss_config), "packed": packed}))
        self._lock = threading.Lock()
        self._m = _Membership(members=[cell_id])
        self._next_epoch = 0
        self.current_version = 0
        self.step_target: int | None = None
        self.done_in_step = 0

    @property
    def rendezvous_uri(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def members(self) -> tuple[str, ...]:
        with self._lock:
            return tuple(self._m.members)

    def request_join(self, cell_id: str) -> JoinTicket:
        """Admit a satellite from the next epoch on (mid-step: at the core's next microbatch boundary)."""
        with self._lock:
            target = self.step_target if self.step_target is not None else self.current_version + 1
            if cell_id == self.cell_id:
                return JoinTicket(
                    admitted=False,
                    reason="the core cell is always a member",
                    target_version=target,
                    dp_rank=0,
                    dp_world_size=len(self._m.members),
                )
            planned = [m for m in self._m.members if m not in self._m.pending_leaves] + [
                c for c in self._m.pending_joins if c not in self._m.members
            ]
            if cell_id in self._m.pending_leaves:
                return JoinTicket(
                    admitted=False,
                    reason=f"{cell_id} is leaving; ask again once it left",
                    target_version=target,
                    dp_rank=0,
                    dp_world_size=len(planned),
                )
            if cell_id not in planned:
                self._m.pending_joins.append(cell_id)
                planned.append(cell_id)
                self.store.delete_key(f"released/{cell_id}")
        return JoinTicket(
            admitted=True,
            reason="",
            target_version=target,
            dp_rank=planned.index(cell_id),
            dp_world_size=len(planned),
        )

    def request_leave(self, cell_id: str) -> Future[LeaveResult]:
        """Take a satellite out after its microbatch in progress; resolves once it is out."""
        future: Future[LeaveResult] = Future()
        with self._lock:
            if cell_id in self._m.pending_joins:
                self._m.pending_joins.remove(cell_id)
                self.store.set(f"released/{cell_id}", "1")
                future.set_result(
                    LeaveResult(
                        num_micro_batches_completed=0,
                        num_micro_batches_reassigned=0,
                        target_version=self.current_version + 1,
                    )
                )
                return future
            if cell_id not in self._m.members or cell_id == self.cell_id:
                future.set_exception(KeyError(cell_id))
                return future
            existing = self._m.pending_leaves.get(cell_id)
            if existing is not None:
                return existing
            self._m.pending_leaves[cell_id] = future
            if self.step_target is None:
                self._apply_leaves_locked()
        return future

    def _apply_leaves_locked(self) -> None:
        for cell, future in list(self._m.pending_leaves.items()):
            self._m.members.remove(cell)
            self.store.set(f"released/{cell}", "1")
            completed = int(self.store.add(f"count/{cell}", 0))
            future.set_result(
                LeaveResult(
                    num_micro_batches_completed=completed,
                    num_micro_batches_reassigned=0,
                    target_version=self.step_target or self.current_version + 1,
                )
            )
        self._m.pending_leaves.clear()

    def _has_pending(self) -> bool:
        with self._lock:
            return bool(self._m.pending_joins or self._m.pending_leaves)

    def _open_epoch(
        self, model: PreTrainedModel, *, version: int, num_microbatches: int
    ) -> tuple[EpochPlan, dist.ProcessGroup | None]:
        with self._lock:
            self._apply_leaves_locked()
            self._m.members.extend(c for c in self._m.pending_joins if c not in self._m.members)
            self._m.pending_joins.clear()
            plan = EpochPlan(
                epoch=self._next_epoch,
                version=version,
                members=tuple(self._m.members),
                num_microbatches=num_microbatches,
            )
            self._next_epoch += 1
        self.store.set(f"epoch/{plan.epoch}", plan.encode())
        self.store.set("epoch/latest", str(plan.epoch))
        if len(plan.members) == 1:
            return plan, None
        group = make_group(
            self.store, epoch=plan.epoch, rank=0, size=len(plan.members), timeout_s=self.timeout_s
        )
        group.broadcast(parameters_vector(model).clone(), 0).wait()
        log.info("dp_epoch_opened", epoch=plan.epoch, version=version, members=list(plan.members))
        return plan, group

    def compute_step_gradient(
        self,
        model: PreTrainedModel,
        microbatches: Sequence[Sequence[Sample]],
        *,
        version: int,
        after_microbatch: Callable[[int], None] | None = None,
    ) -> StepGradient:
        """Sum of every microbatch's gradient for the step producing `version`, members joining as they ask.

        `after_microbatch(i)` runs on the core after it finishes microbatch i (tests and the
        benchmark use it to make satellites join at chosen points).
        """
        n = len(microbatches)
        prefix = f"step/{version}/"
        for i, mb in enumerate(microbatches):
            self.store.set(f"{prefix}mb/{i}", encode_microbatch(mb))  # type: ignore[arg-type]
        with self._lock:
            self.step_target = version
            self.done_in_step = 0
        total_P = torch.zeros_like(parameters_vector(model), dtype=torch.float64)
        max_world = 1
        participants: set[str] = set()
        num_targets = 0
        loss = 0.0
        try:
            while True:
                plan, group = self._open_epoch(model, version=version, num_microbatches=n)
                max_world = max(max_world, len(plan.members))
                participants.update(plan.members[1:])
                acc_P = torch.zeros_like(total_P)
                finished = False
                while True:
                    work_left = int(self.store.add(f"{prefix}next", 0)) < n
                    if work_left and self._has_pending():
                        break
                    i = int(self.store.add(f"{prefix}next", 1)) - 1 if work_left else n
                    if i < n:
                        result = microbatch_gradient(
                            model, microbatches[i], self.loss_config, packed=self.packed
                        )
                        acc_P += result.grad_P
                        num_targets += result.num_targets
                        loss += result.stats.loss
                        self.store.add(f"count/{self.cell_id}", 1)
                        with self._lock:
                            self.done_in_step = int(self.store.add(f"{prefix}done", 1))
                        if after_microbatch is not None:
                            after_microbatch(i)
                        continue
                    if int(self.store.add(f"{prefix}done", 0)) >= n:
                        finished = True
                        break
                    time.sleep(POLL_S)
                self.store.set(f"epoch/{plan.epoch}/end", json.dumps({"next": plan.epoch + 1}))
                if group is not None:
                    group.allreduce([acc_P]).wait()
                total_P += acc_P
                if finished:
                    break
        finally:
            with self._lock:
                self.done_in_step = int(self.store.add(f"{prefix}done", 0))
                self.step_target = None
                self.current_version = version
                self._apply_leaves_locked()
        # Targets and loss counted on the core only cover its own microbatches; members report theirs.
        for cell in sorted(participants):
            num_targets += int(self.store.add(f"targets/{version}/{cell}", 0))
            loss += (
                float(self.store.get(f"loss/{version}/{cell}"))
                if self.store.check([f"loss/{version}/{cell}"])
                else 0.0
            )
        return StepGradient(
            grad_P=total_P, num_microbatches=n, max_world_size=max_world, num_targets=num_targets, loss=loss
        )


def run_satellite(
    rendezvous_uri: str, *, cell_id: str, timeout_s: float = 120.0, idle_timeout_s: float = 3600.0
) -> int:
    """A satellite's training loop: wait to be admitted, then compute and reduce until released.

    Returns the number of microbatches it computed.
    """
    host, port = rendezvous_uri.removeprefix("tcp://").rsplit(":", 1)
    store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
    config = Qwen2Config.from_dict(json.loads(store.get("model/config")))
    loss_fields = json.loads(store.get("loss/config"))
    packed = bool(loss_fields.pop("packed"))
    loss_config = LossConfig(**loss_fields)
    model = build_model(config, seed=0)  # its weights come from the core's broadcast
    released = f"released/{cell_id}"

    def is_released() -> bool:
        return bool(store.check([released]))

    deadline = time.monotonic() + timeout_s
    epoch: int | None = None
    while epoch is None:  # admission: the first epoch naming this cell
        if is_released():
            return 0
        if store.check(["epoch/latest"]):
            latest = int(store.get("epoch/latest"))
            if cell_id in EpochPlan.decode(store.get(f"epoch/{latest}")).members:
                epoch = latest
                break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{cell_id} was not admitted within {timeout_s} s")
        time.sleep(0.01)
    computed = 0
    while True:
        plan = EpochPlan.decode(store.get(f"epoch/{epoch}"))
        if cell_id not in plan.members:
            return computed
        group = make_group(
            store, epoch=epoch, rank=plan.members.index(cell_id), size=len(plan.members), timeout_s=timeout_s
        )
        weights_P = torch.empty_like(parameters_vector(model))
        group.broadcast(weights_P, 0).wait()
        load_parameters_vector(model, weights_P)
        prefix = f"step/{plan.version}/"
        acc_P = torch.zeros_like(weights_P, dtype=torch.float64)
        end_key = f"epoch/{epoch}/end"
        while not store.check([end_key]):
            if int(store.add(f"{prefix}next", 0)) >= plan.num_microbatches:
                time.sleep(POLL_S)
                continue
            i = int(store.add(f"{prefix}next", 1)) - 1
            if i >= plan.num_microbatches:
                continue
            result = microbatch_gradient(
                model, decode_microbatch(store.get(f"{prefix}mb/{i}")), loss_config, packed=packed
            )
            acc_P += result.grad_P
            computed += 1
            store.add(f"targets/{plan.version}/{cell_id}", result.num_targets)
            key = f"loss/{plan.version}/{cell_id}"
            prev = float(store.get(key)) if store.check([key]) else 0.0
            store.set(key, repr(prev + result.stats.loss))
            store.add(f"count/{cell_id}", 1)
            store.add(f"{prefix}done", 1)
        group.allreduce([acc_P]).wait()
        epoch = int(json.loads(store.get(end_key))["next"])
        # Between steps the next epoch may be far off; a release ends the wait.
        if not _wait_key(
            store, f"epoch/{epoch}", deadline=time.monotonic() + idle_timeout_s, also=is_released
        ):
            return computed
