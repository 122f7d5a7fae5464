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

A satellite that dies (its heartbeat, `alive/<cell>` ticked by a thread of its own, stops for
`dead_after_s`) takes its unreduced partial sum with it. Redoing only "its" microbatches would
need to know which were in that sum; instead the core aborts the epoch (`end` with `abort`:
survivors skip the reduction), drops the dead member and computes the step again as a new
*attempt* (fresh counters) from the same weights and microbatches, so the gradient stays exact.
After `max_attempts` the step fails with StepFailed and the step loop retries it later (its
groups stay queued). Not covered: a member dying inside a collective makes the collective raise
on the core (then the same retry) but may also crash other satellites, which then count as lost.

Store keys: `model/config`, `loss/config`; `epoch/latest`; `epoch/<k>` (JSON plan);
`epoch/<k>/end` (JSON {"next": k+1, "abort"?}); `step/<v>/mb/<i>`; per attempt a:
`step/<v>/<a>/next`, `step/<v>/<a>/done`, `step/<v>/<a>/targets/<cell>`, `step/<v>/<a>/loss/<cell>`;
`count/<cell>`; `released/<cell>`; `alive/<cell>`.
"""

from __future__ import annotations

import dataclasses
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
HEARTBEAT_S = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class EpochPlan:
    epoch: int
    version: int
    """The version the step being computed will produce."""
    members: tuple[str, ...]
    """Cell ids; the index is the rank, the core is rank 0."""
    num_microbatches: int
    attempt: int = 0
    """Attempt of the step: a member lost mid-step makes the core redo the step as a new attempt."""

    @property
    def counters(self) -> str:
        """Store prefix of this attempt's counters (`next`, `done`) and per-member reports."""
        return f"step/{self.version}/{self.attempt}/"

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
            attempt=d.get("attempt", 0),
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


class StepFailed(RuntimeError):
    """A step could not be computed: members kept dying (each loss costs one attempt)."""


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
        dead_after_s: float = 5.0,
        max_attempts: int = 3,
    ) -> None:
        self.host = host
        self.cell_id = cell_id
        self.dead_after_s = dead_after_s
        self.max_attempts = max_attempts
        self._heard: dict[str, tuple[int, float]] = {}
        """Per satellite: its last heartbeat count and when the core saw it change."""
        self.lost: list[str] = []
        """Satellites declared dead, oldest first (the service reports them as LEAVE_REASON_LOST)."""
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
        self._attempts_started = 0
        """Attempts numbered across steps: a step computed again after an error (same version)
        must not find the counters of the failed one, or it waits for microbatches never done."""
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
        self, model: PreTrainedModel, *, version: int, attempt: int, num_microbatches: int
    ) -> tuple[EpochPlan, dist.ProcessGroup | None]:
        dead = self._dead_members(self.members())  # died between steps: not worth a group that cannot form
        if dead:
            self._drop(dead)
        with self._lock:
            self._apply_leaves_locked()
            joining = [c for c in self._m.pending_joins if c not in self._m.members]
            self._m.members.extend(joining)
            self._m.pending_joins.clear()
            plan = EpochPlan(
                epoch=self._next_epoch,
                version=version,
                members=tuple(self._m.members),
                num_microbatches=num_microbatches,
                attempt=attempt,
            )
            self._next_epoch += 1
        now = time.monotonic()
        for cell in joining:  # a newcomer's heartbeat clock starts now
            self._heard[cell] = (int(self.store.add(f"alive/{cell}", 0)), now)
        self.store.set(f"epoch/{plan.epoch}", plan.encode())
        self.store.set("epoch/latest", str(plan.epoch))
        if len(plan.members) == 1:
            return plan, None
        try:
            group = make_group(
                self.store, epoch=plan.epoch, rank=0, size=len(plan.members), timeout_s=self.timeout_s
            )
            group.broadcast(parameters_vector(model).clone(), 0).wait()
        except RuntimeError:
            self._abort_epoch(plan)
            raise _MembersLost(self._wait_for_dead(plan.members)) from None
        log.info(
            "dp_epoch_opened", epoch=plan.epoch, version=version, attempt=attempt, members=list(plan.members)
        )
        return plan, group

    def _dead_members(self, members: Sequence[str]) -> list[str]:
        """Satellites whose heartbeat counter has not moved for `dead_after_s`."""
        now = time.monotonic()
        dead = []
        for cell in members:
            if cell == self.cell_id:
                continue
            count = int(self.store.add(f"alive/{cell}", 0))
            last = self._heard.get(cell)
            if last is None or last[0] != count:
                self._heard[cell] = (count, now)
            elif now - last[1] > self.dead_after_s:
                dead.append(cell)
        return dead

    def _wait_for_dead(self, members: Sequence[str]) -> list[str]:
        """After a failed collective: the members whose heartbeat stops within `dead_after_s`."""
        deadline = time.monotonic() + 2 * self.dead_after_s
        while time.monotonic() < deadline:
            dead = self._dead_members(members)
            if dead:
                return dead
            time.sleep(0.05)
        raise StepFailed(f"a collective of members {list(members)} failed, yet every member is alive")

    def _drop(self, cells: Sequence[str]) -> None:
        with self._lock:
            for cell in cells:
                if cell in self._m.members:
                    self._m.members.remove(cell)
                future = self._m.pending_leaves.pop(cell, None)
                if future is not None:  # it asked to leave, then died: it is out all the same
                    future.set_result(
                        LeaveResult(
                            num_micro_batches_completed=int(self.store.add(f"count/{cell}", 0)),
                            num_micro_batches_reassigned=0,
                            target_version=self.step_target or self.current_version + 1,
                        )
                    )
                self._heard.pop(cell, None)
                self.lost.append(cell)
        for cell in cells:
            self.store.set(f"released/{cell}", "1")  # should it come back, it stops instead of rejoining
        log.warning("dp_members_lost", cells=list(cells))

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
        lost: list[str] = []
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
                    lost.extend(exc.cells)
                    self._drop(exc.cells)
                    log.warning(
                        "dp_step_attempt_dropped", version=version, attempt=attempt, lost=list(exc.cells)
                    )
                    continue
                return dataclasses.replace(result, attempts=attempt + 1, lost_cells=tuple(lost))
            raise StepFailed(
                f"step {version}: {self.max_attempts} attempts lost members ({', '.join(lost)}); giving up"
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
                    result = microbatch_gradient(model, microbatches[i], self.loss_config, packed=self.packed)
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


def _heartbeat(rendezvous: tuple[str, int], cell_id: str, stop: threading.Event, *, timeout_s: float) -> None:
    """Tick `alive/<cell>` every HEARTBEAT_S on a connection of its own, even while a collective blocks."""
    store = TCPStore(rendezvous[0], rendezvous[1], is_master=False, timeout=timedelta(seconds=timeout_s))
    while not stop.is_set():
        store.add(f"alive/{cell_id}", 1)
        stop.wait(HEARTBEAT_S)


def run_satellite(
    rendezvous_uri: str, *, cell_id: str, timeout_s: float = 120.0, idle_timeout_s: float = 3600.0
) -> int:
    """A satellite's training loop: wait to be admitted, then compute and reduce until released.

    Returns the number of microbatches it computed.
    """
    host, port = rendezvous_uri.removeprefix("tcp://").rsplit(":", 1)
    stop = threading.Event()
    beat = threading.Thread(
        target=_heartbeat,
        args=((host, int(port)), cell_id, stop),
        kwargs={"timeout_s": timeout_s},
        daemon=True,
    )
    beat.start()
    try:
        return _satellite_loop(
            host, int(port), cell_id=cell_id, timeout_s=timeout_s, idle_timeout_s=idle_timeout_s
        )
    finally:
        stop.set()
        beat.join(timeout=5)


def _satellite_loop(host: str, port: int, *, cell_id: str, timeout_s: float, idle_timeout_s: float) -> int:
    store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
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
        counters = plan.counters
        acc_P = torch.zeros_like(weights_P, dtype=torch.float64)
        end_key = f"epoch/{epoch}/end"
        while not store.check([end_key]):
            if int(store.add(f"{counters}next", 0)) >= plan.num_microbatches:
                time.sleep(POLL_S)
                continue
            i = int(store.add(f"{counters}next", 1)) - 1
            if i >= plan.num_microbatches:
                continue
            result = microbatch_gradient(
                model, decode_microbatch(store.get(f"step/{plan.version}/mb/{i}")), loss_config, packed=packed
            )
            acc_P += result.grad_P
            computed += 1
            store.add(f"{counters}targets/{cell_id}", result.num_targets)
            key = f"{counters}loss/{cell_id}"
            prev = float(store.get(key)) if store.check([key]) else 0.0
            store.set(key, repr(prev + result.stats.loss))
            store.add(f"count/{cell_id}", 1)
            store.add(f"{counters}done", 1)
        end = json.loads(store.get(end_key))
        if not end.get("abort"):  # aborted: a member died, the step is redone as a new attempt
            group.allreduce([acc_P]).wait()
        epoch = int(end["next"])
        # Between steps the next epoch may be far off; a release ends the wait.
        if not _wait_key(
            store, f"epoch/{epoch}", deadline=time.monotonic() + idle_timeout_s, also=is_released
        ):
            return computed
