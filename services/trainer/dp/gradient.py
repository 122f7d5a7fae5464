"""The core's side of the gradient protocol: epochs, work counters, float64 reductions, attempts (shell).

See the package docstring for why the step gradient does not depend on who computed which
microbatch, and how a lost member costs an attempt instead of the step's exactness.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog
import torch
import torch.distributed as dist
from transformers import PretrainedConfig, PreTrainedModel

from services.trainer.dp.membership import POLL_S, EpochPlan, Membership, StepFailed, make_group
from services.trainer.lora import LoraSpec
from services.trainer.loss import LossConfig
from services.trainer.microbatch import encode_microbatch, microbatch_gradient, parameters_vector
from services.trainer.samples import Sample

log = structlog.get_logger(__name__)


class _MembersLost(Exception):
    def __init__(self, cells: Sequence[str]) -> None:
        super().__init__(", ".join(cells))
        self.cells = tuple(cells)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepGradient:
    grad_P: torch.Tensor
    """float64 sum of every microbatch's gradient."""
    num_microbatches: int
    max_world_size: int
    num_targets: int
    loss: float
    attempts: int = 1
    lost_cells: tuple[str, ...] = ()


class DataParallelCore(Membership):
    """The core cell's side: owns the store (via Membership), the epochs and the reductions."""

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
        dead_after_s: float = 5.0,
        join_timeout_s: float = 20.0,
        max_attempts: int = 3,
        backend: str = "gloo",
        autocast_bf16: bool = False,
        lora: LoraSpec | None = None,
        base_folder: Path | None = None,
    ) -> None:
        """`lora` and `base_folder`: a LoRA run; satellites load the frozen base from that folder
        (on shared storage, or a copy at the same path) and every epoch broadcasts the adapter alone."""
        super().__init__(
            host=host,
            port=port,
            cell_id=cell_id,
            timeout_s=timeout_s,
            dead_after_s=dead_after_s,
            join_timeout_s=join_timeout_s,
        )
        self.max_attempts = max_attempts
        self.loss_config = loss_config
        self.packed = packed
        self.backend = backend
        """Collective backend of every epoch's group: each member's device decides (NCCL on CUDA)."""
        self.autocast_bf16 = autocast_bf16
        self.store.set("model/config", model_config.to_json_string())
        self.store.set(
            "loss/config",
            json.dumps({**asdict(loss_config), "packed": packed, "autocast_bf16": autocast_bf16}),
        )
        if lora is not None:
            assert base_folder is not None, "satellites of a LoRA run need the base weights' folder"
            self.store.set("lora/config", lora.to_json())
            self.store.set("model/base_folder", str(base_folder.resolve()))
        self._attempts_started = 0
        """Attempts numbered across steps: a step computed again after an error (same version)
        must not find the counters of the failed one, or it waits for microbatches never done."""

    def _open_epoch(
        self, model: PreTrainedModel, *, version: int, attempt: int, num_microbatches: int
    ) -> tuple[EpochPlan, dist.ProcessGroup | None]:
        while True:
            dead = self._dead_members(self.members())  # died between steps: no group can form
            if dead:
                self._drop(dead)
            with self._lock:
                joining = self._apply_changes_locked()
                plan = EpochPlan(
                    epoch=self._next_epoch,
                    version=version,
                    members=tuple(self._m.members),
                    num_microbatches=num_microbatches,
                    attempt=attempt,
                )
                self._next_epoch += 1
            self._start_heartbeat_clocks(joining)
            self.store.set(f"epoch/{plan.epoch}", plan.encode())
            self.store.set("epoch/latest", str(plan.epoch))
            if len(plan.members) == 1:
                return plan, None
            unready = self._unready(plan, joining)
            if not unready:
                break
            # A member that cannot take up the epoch (a join that failed, a satellite gone between
            # steps) is dropped before anyone forms the group; the rest open the next epoch.
            self._abort_epoch(plan)
            self._drop(unready)
        self.store.set(f"epoch/{plan.epoch}/go", "1")
        try:
            group = make_group(
                self.store,
                epoch=plan.epoch,
                rank=0,
                size=len(plan.members),
                timeout_s=self.timeout_s,
                backend=self.backend,
            )
            group.broadcast(parameters_vector(model).clone(), 0).wait()
        except RuntimeError:
            self._abort_epoch(plan)
            raise _MembersLost(self._wait_for_dead(plan.members)) from None
        log.info(
            "dp_epoch_opened", epoch=plan.epoch, version=version, attempt=attempt, members=list(plan.members)
        )
        return plan, group

    def _abort_epoch(self, plan: EpochPlan) -> None:
        """Survivors see `abort`: they skip the reduction and wait for the next epoch (a new attempt)."""
        self.store.set(f"epoch/{plan.epoch}/end", json.dumps({"next": plan.epoch + 1, "abort": True}))

    def compute_step_gradient(
        self,
        model: PreTrainedModel,
        microbatches: Sequence[Sequence[Sample]],
        *,
        version: int,
        after_microbatch: Callable[[int], None] | None = None,
    ) -> StepGradient:
        """Sum of every microbatch's gradient for the step producing `version`, members joining as they ask.

        A satellite that dies (heartbeat silent for `dead_after_s`) takes its partial sum with it,
        and nothing says which of its microbatches that sum held once others were reduced; so the
        attempt is dropped whole and the step is computed again by the survivors, from the same
        weights and microbatches: the gradient stays exact. After `max_attempts`: StepFailed.

        `after_microbatch(i)` runs on the core after it finishes microbatch i (tests and the
        benchmark use it to make satellites join at chosen points).
        """
        for i, mb in enumerate(microbatches):
            self.store.set(f"step/{version}/mb/{i}", encode_microbatch(mb))  # type: ignore[arg-type]
        with self._lock:
            self.step_target = version
            self.done_in_step = 0
            lost_before = len(self.lost)
        try:
            for attempt in range(self.max_attempts):
                self._attempts_started += 1
                try:
                    result = self._attempt(
                        model,
                        microbatches,
                        version=version,
                        attempt=self._attempts_started,
                        hook=after_microbatch,
                    )
                except _MembersLost as exc:
                    self._drop(exc.cells)
                    log.warning(
                        "dp_step_attempt_dropped", version=version, attempt=attempt, lost=list(exc.cells)
                    )
                    continue
                # Lost in this step: members that died and joiners that never took their epoch up.
                lost = tuple(self.lost[lost_before:])
                return dataclasses.replace(result, attempts=attempt + 1, lost_cells=lost)
            raise StepFailed(
                f"step {version}: {self.max_attempts} attempts lost members "
                f"({', '.join(self.lost[lost_before:])}); giving up"
            )
        finally:
            with self._lock:
                self.step_target = None
                self.current_version = version
                self._apply_leaves_locked()

    def _attempt(
        self,
        model: PreTrainedModel,
        microbatches: Sequence[Sequence[Sample]],
        *,
        version: int,
        attempt: int,
        hook: Callable[[int], None] | None,
    ) -> StepGradient:
        n = len(microbatches)
        total_P = torch.zeros_like(parameters_vector(model), dtype=torch.float64)
        max_world = 1
        participants: set[str] = set()
        num_targets = 0
        loss = 0.0
        counters = ""
        while True:
            plan, group = self._open_epoch(model, version=version, attempt=attempt, num_microbatches=n)
            counters = plan.counters
            max_world = max(max_world, len(plan.members))
            participants.update(plan.members[1:])
            acc_P = torch.zeros_like(total_P)
            finished = False
            next_check = 0.0
            while True:
                if time.monotonic() >= next_check:  # a few store reads per member, ten times a second
                    next_check = time.monotonic() + 0.1
                    dead = self._dead_members(plan.members)
                    if dead:
                        self._abort_epoch(plan)
                        raise _MembersLost(dead)
                work_left = int(self.store.add(f"{counters}next", 0)) < n
                if work_left and self._has_pending():
                    break
                i = int(self.store.add(f"{counters}next", 1)) - 1 if work_left else n
                if i < n:
                    result = microbatch_gradient(
                        model,
                        microbatches[i],
                        self.loss_config,
                        packed=self.packed,
                        autocast_bf16=self.autocast_bf16,
                    )
                    acc_P += result.grad_P
                    num_targets += result.num_targets
                    loss += result.stats.loss
                    self.store.add(f"count/{self.cell_id}", 1)
                    with self._lock:
                        self.done_in_step = int(self.store.add(f"{counters}done", 1))
                    if hook is not None:
                        hook(i)
                    continue
                if int(self.store.add(f"{counters}done", 0)) >= n:
                    finished = True
                    break
                time.sleep(POLL_S)
            self.store.set(f"epoch/{plan.epoch}/end", json.dumps({"next": plan.epoch + 1}))
            if group is not None:
                try:
                    group.allreduce([acc_P]).wait()
                except RuntimeError:  # a member died between its last microbatch and the reduction
                    raise _MembersLost(self._wait_for_dead(plan.members)) from None
            total_P += acc_P
            if finished:
                break
        # Targets and loss counted on the core only cover its own microbatches; members report theirs.
        for cell in sorted(participants):
            num_targets += int(self.store.add(f"{counters}targets/{cell}", 0))
            key = f"{counters}loss/{cell}"
            loss += float(self.store.get(key)) if self.store.check([key]) else 0.0
        return StepGradient(
            grad_P=total_P, num_microbatches=n, max_world_size=max_world, num_targets=num_targets, loss=loss
        )
