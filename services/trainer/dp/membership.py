"""Membership and rendezvous of dynamic data parallelism: store, epochs, joins, leaves, heartbeats (shell).

The core cell owns a `TCPStore`; this module holds who is a member and who is about to become
or stop being one. Joins and leaves are queued here and applied by the gradient protocol at an
epoch boundary (`apply_changes_locked`), so a member list never changes inside an epoch. A
satellite's heartbeat (`alive/<cell>`, ticked by a thread of its own) tells the core which
members died; `drop` takes them out and releases them, so a late comeback stops instead of
rejoining.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

import structlog
import torch.distributed as dist
from torch.distributed import PrefixStore, Store, TCPStore  # type: ignore[attr-defined]

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


def make_group(
    store: Store, *, epoch: int, rank: int, size: int, timeout_s: float, backend: str = "gloo"
) -> dist.ProcessGroup:
    """The process group of one epoch: gloo on CPU, NCCL when the members compute on CUDA devices.

    The NCCL branch has not run on a GPU yet (see `services.trainer.device`).
    """
    prefixed = PrefixStore(f"pg/{epoch}/", store)
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise RuntimeError("backend nccl: this torch build has no NCCL (a CPU-only wheel?)")
        nccl_group: Any = getattr(dist, "ProcessGroupNCCL")  # noqa: B009 (absent from CPU wheels)
        options = nccl_group.Options()
        options._timeout = timedelta(seconds=timeout_s)
        group_nccl: dist.ProcessGroup = nccl_group(prefixed, rank, size, options)
        return group_nccl
    if backend != "gloo":
        raise ValueError(f"backend must be gloo or nccl, got {backend!r}")
    group: dist.ProcessGroup = dist.ProcessGroupGloo(prefixed, rank, size, timedelta(seconds=timeout_s))  # type: ignore[assignment]
    return group


def parse_rendezvous(uri: str) -> tuple[str, int]:
    """`tcp://host:port` -> (host, port)."""
    host, port = uri.removeprefix("tcp://").rsplit(":", 1)
    return host, int(port)


@dataclass(slots=True)
class _Members:
    members: list[str]
    pending_joins: list[str] = field(default_factory=list)
    pending_leaves: dict[str, Future[LeaveResult]] = field(default_factory=dict)


class Membership:
    """The core cell's rendezvous store and member list; joins and leaves wait for an epoch boundary."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        cell_id: str,
        timeout_s: float,
        dead_after_s: float,
        join_timeout_s: float = 20.0,
    ) -> None:
        self.host = host
        self.join_timeout_s = join_timeout_s
        """How long a member may take to take up an epoch before it is dropped (a join that fails
        fails in this time, not in the collective timeout)."""
        self.cell_id = cell_id
        self.dead_after_s = dead_after_s
        self.timeout_s = timeout_s
        self._heard: dict[str, tuple[int, float]] = {}
        """Per satellite: its last heartbeat count and when the core saw it change."""
        self.lost: list[str] = []
        """Satellites declared dead, oldest first (the service reports them as LEAVE_REASON_LOST)."""
        self.store = TCPStore(
            host, port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
        )
        self.port = self.store.port
        self._lock = threading.Lock()
        self._m = _Members(members=[cell_id])
        self.current_version = 0
        self.step_target: int | None = None
        self.done_in_step = 0
        self._next_epoch = 0
        self._sessions: dict[str, int] = {}
        """Per satellite: its current session (one per admitted JoinStep; see `request_join`)."""

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
                self._open_session_locked(cell_id)
        return JoinTicket(
            admitted=True,
            reason="",
            target_version=target,
            dp_rank=planned.index(cell_id),
            dp_world_size=len(planned),
        )

    def _open_session_locked(self, cell_id: str) -> None:
        """A new session of the satellite: its own release key, and the first epoch it may take.

        Epochs numbered from `_next_epoch` on are opened after this join, so the satellite never
        takes an epoch of an earlier session (whose group is gone: that was the leave/rejoin
        stall, a rejoined satellite forming a finished epoch's group and waiting out its timeout).
        Release keys are per session and never deleted, so a session that was released stays
        released even when the next join comes before it saw its release.
        """
        session = int(self.store.add(f"session/{cell_id}", 1))
        self.store.set(f"join/{cell_id}/{session}", str(self._next_epoch))
        self._sessions[cell_id] = session

    def _release(self, cell_id: str) -> None:
        """End the satellite's current session: it stops at its next check."""
        self.store.set(f"released/{cell_id}/{self._sessions.get(cell_id, 0)}", "1")

    def request_leave(self, cell_id: str) -> Future[LeaveResult]:
        """Take a satellite out after its microbatch in progress; resolves once it is out."""
        future: Future[LeaveResult] = Future()
        with self._lock:
            if cell_id in self._m.pending_joins:
                self._m.pending_joins.remove(cell_id)
                self._release(cell_id)
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
            self._release(cell)
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

    def _apply_changes_locked(self) -> list[str]:
        """At an epoch boundary: leavers out, joiners in; returns the joiners."""
        self._apply_leaves_locked()
        joining = [c for c in self._m.pending_joins if c not in self._m.members]
        self._m.members.extend(joining)
        self._m.pending_joins.clear()
        return joining

    def _start_heartbeat_clocks(self, cells: Sequence[str]) -> None:
        now = time.monotonic()
        for cell in cells:  # a newcomer's heartbeat clock starts now
            self._heard[cell] = (int(self.store.add(f"alive/{cell}", 0)), now)

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

    def _unready(self, plan: EpochPlan, joining: Sequence[str]) -> list[str]:
        """Wait until every satellite of the epoch took it up (`epoch/<k>/ready/<cell>`); returns
        those that did not within `join_timeout_s`, or, for members of the previous epoch, whose
        heartbeat stopped for `dead_after_s` (a joiner's worker may still be starting up).

        Nobody forms the epoch's group before the core's `go`, so dropping them costs no work:
        every earlier epoch's partial sums are reduced already.
        """
        waiting = [c for c in plan.members if c != self.cell_id]
        deadline = time.monotonic() + self.join_timeout_s
        while waiting:
            waiting = [c for c in waiting if not self.store.check([f"epoch/{plan.epoch}/ready/{c}"])]
            dead = self._dead_members([c for c in waiting if c not in joining])
            if dead:
                return dead
            if waiting and time.monotonic() > deadline:
                return waiting
            if waiting:
                time.sleep(POLL_S)
        self._start_heartbeat_clocks(joining)  # ready: their heartbeat counts from now
        return []

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
            self._release(cell)  # should it come back, it stops instead of rejoining
        log.warning("dp_members_lost", cells=list(cells))
