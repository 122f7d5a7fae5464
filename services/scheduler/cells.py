"""Cells as the scheduler keeps them: registration rules, roles, loss by silence (pure).

A cell is either the *core* (holds the weights and the optimizer, always trains; its agent is the
trainer) or a *satellite* (an engine for rollout and a worker for data-parallel training). Roles:
`rollout`, `training`, `switching` (towards `target_role`) and `lost` (silent; it takes no work
until it registers again). The shell stores these records in `scheduler.cells`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from gyre.errors import Conflict, InvalidArgument, NotFound

Role = Literal["rollout", "training", "switching", "lost"]
Mode = Literal["colocate", "async", "gyre", "burst"]
MODES: tuple[Mode, ...] = ("colocate", "async", "gyre", "burst")
MAX_SLOTS = 4096
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_ADDRESS = re.compile(r"^[A-Za-z0-9_.\[\]:-]+:\d{1,5}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class CellRecord:
    cell_id: str
    role: Role
    target_role: str = ""  # while switching: "rollout" or "training"
    core: bool
    slots: int
    model_fingerprint: str
    engine_id: str = ""
    engine_address: str = ""
    agent_address: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Registration:
    cell_id: str
    core: bool
    slots: int
    model_fingerprint: str
    engine_id: str
    engine_address: str
    agent_address: str


def _name(field: str, value: str) -> None:
    if not _NAME.match(value):
        raise InvalidArgument(field, f"must be 1..128 characters of [A-Za-z0-9_.:-], got {value!r}")


def _address(field: str, value: str) -> None:
    if not _ADDRESS.match(value):
        raise InvalidArgument(field, f"must be host:port, got {value!r}")


def validate_registration(
    reg: Registration, *, cells: Sequence[CellRecord], cluster_fingerprint: str
) -> None:
    """Raise naming the field: bad names or addresses, a second core, another model's fingerprint.

    Example:
        core cell-0 registered; cell-9 registers with core=True
        -> InvalidArgument("core: cell-0 is already the core cell; a cluster has one")
    """
    _name("cell_id", reg.cell_id)
    if len(reg.model_fingerprint) > 128 or not (reg.core or reg.model_fingerprint):
        raise InvalidArgument("model_fingerprint", "is required for a satellite (1..128 characters)")
    if cluster_fingerprint and reg.model_fingerprint and reg.model_fingerprint != cluster_fingerprint:
        raise InvalidArgument(
            "model_fingerprint",
            f"{reg.model_fingerprint!r} is another model: the cluster serves {cluster_fingerprint!r}",
        )
    _address("agent_address", reg.agent_address)
    if reg.core:
        others = [c.cell_id for c in cells if c.core and c.cell_id != reg.cell_id]
        if others:
            raise InvalidArgument("core", f"{others[0]} is already the core cell; a cluster has one")
        if reg.slots != 0 or reg.engine_address:
            raise InvalidArgument("slots", "the core cell serves no calls: send slots 0 and no engine")
    else:
        if not 1 <= reg.slots <= MAX_SLOTS:
            raise InvalidArgument("slots", f"must be between 1 and {MAX_SLOTS}, got {reg.slots}")
        _name("engine_id", reg.engine_id)
        _address("engine_address", reg.engine_address)
    known = next((c for c in cells if c.cell_id == reg.cell_id), None)
    if known is not None and known.core != reg.core:
        raise InvalidArgument(
            "core", f"{reg.cell_id} is registered as {'core' if known.core else 'satellite'}"
        )
    if known is not None and known.role == "switching":
        raise Conflict(f"cell_id: {reg.cell_id} is switching; register again once the switch ended")


def registered(reg: Registration, *, known: CellRecord | None) -> CellRecord:
    """The record a registration leaves: the core trains; a satellite keeps a live role, else rolls out.

    A satellite that comes back (restarted, or lost) starts in rollout: whatever it trained in was
    lost with it, and the policy moves it again if training needs it.
    """
    if reg.core:
        role: Role = "training"
    elif known is not None and known.role in ("rollout", "training"):
        role = known.role
    else:
        role = "rollout"
    return CellRecord(
        cell_id=reg.cell_id,
        role=role,
        core=reg.core,
        slots=reg.slots,
        model_fingerprint=reg.model_fingerprint,
        engine_id=reg.engine_id,
        engine_address=reg.engine_address,
        agent_address=reg.agent_address,
    )


def check_switch(cell: CellRecord | None, *, cell_id: str, role: str) -> CellRecord:
    """The satellite to switch to `role`, or an error naming the field.

    Example: check_switch(core cell-0, role="rollout") -> InvalidArgument("cell_id: cell-0 is the core ...")
    """
    if role not in ("rollout", "training"):
        raise InvalidArgument("role", f"must be ROLLOUT or TRAINING, got {role!r}")
    if cell is None:
        raise NotFound(f"cell_id: no cell {cell_id!r} is registered")
    if cell.core:
        raise InvalidArgument("cell_id", f"{cell_id} is the core cell: it always trains")
    if cell.role == "switching":
        raise Conflict(f"cell_id: {cell_id} is already switching to {cell.target_role}")
    if cell.role == "lost":
        raise Conflict(f"cell_id: {cell_id} is lost; it must register again")
    if cell.role == role:
        raise Conflict(f"cell_id: {cell_id} is already in the {role} role")
    return cell


def silent_cells(
    heartbeats: Sequence[tuple[CellRecord, float]], *, now_s: float, lost_after_s: float
) -> list[tuple[CellRecord, float]]:
    """Cells (not lost yet) whose last heartbeat is older than `lost_after_s`, with their silence.

    Example: [(cell-1, t=10.0), (cell-2, t=14.5)], now 16.0, limit 5 -> [(cell-1, 6.0)]
    """
    return [
        (cell, now_s - last)
        for cell, last in heartbeats
        if cell.role != "lost" and now_s - last > lost_after_s
    ]


def parse_mode(name: str) -> Mode:
    if name not in MODES:
        raise InvalidArgument("mode", f"must be one of {', '.join(MODES)}, got {name!r}")
    return name  # type: ignore[return-value]
