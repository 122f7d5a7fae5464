"""The satellite process's side of dynamic data parallelism: wait to be admitted, compute, reduce (shell).

A satellite reads the model and loss configuration from the core's store, builds the model
(its weights come from each epoch's broadcast; in a LoRA run it loads the frozen base from the
folder the store names and attaches the adapters, and the broadcast is the adapter alone), then
per epoch takes microbatches off the shared counter until the core ends the epoch, all-reduces
its float64 partial sum (unless the epoch was aborted because a member died) and waits for the
next epoch or its release.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
from torch.distributed import TCPStore  # type: ignore[attr-defined]
from transformers import PreTrainedModel, Qwen2Config

from services.trainer.device import DevicePlan, check_device, place
from services.trainer.dp.membership import (
    HEARTBEAT_S,
    POLL_S,
    EpochPlan,
    make_group,
    parse_rendezvous,
)
from services.trainer.lora import LoraSpec, attach_lora
from services.trainer.loss import LossConfig
from services.trainer.microbatch import (
    decode_microbatch,
    load_parameters_vector,
    microbatch_gradient,
    parameters_vector,
)
from services.trainer.policy import build_model, load_model

IDLE_POLL_S = 0.02


def _heartbeat(rendezvous: tuple[str, int], cell_id: str, stop: threading.Event, *, timeout_s: float) -> None:
    """Tick `alive/<cell>` every HEARTBEAT_S on a connection of its own, even while a collective blocks."""
    store = TCPStore(rendezvous[0], rendezvous[1], is_master=False, timeout=timedelta(seconds=timeout_s))
    while not stop.is_set():
        store.add(f"alive/{cell_id}", 1)
        stop.wait(HEARTBEAT_S)


def run_satellite(
    rendezvous_uri: str,
    *,
    cell_id: str,
    timeout_s: float = 120.0,
    idle_timeout_s: float = 3600.0,
    device: str = "cpu",
    before_join: bool = False,
) -> int:
    """A satellite's training loop: wait to be admitted, then compute and reduce until released.

    `before_join`: this process may have started before the core admitted its join (see
    `_session`). Returns the number of microbatches it computed.
    """
    host, port = parse_rendezvous(rendezvous_uri)
    stop = threading.Event()
    beat = threading.Thread(
        target=_heartbeat,
        args=((host, port), cell_id, stop),
        kwargs={"timeout_s": timeout_s},
        daemon=True,
    )
    beat.start()
    try:
        return _satellite_loop(
            host,
            port,
            cell_id=cell_id,
            timeout_s=timeout_s,
            idle_timeout_s=idle_timeout_s,
            device_plan=DevicePlan(device=device),
            before_join=before_join,
        )
    finally:
        stop.set()
        beat.join(timeout=5)


def _satellite_loop(
    host: str,
    port: int,
    *,
    cell_id: str,
    timeout_s: float,
    idle_timeout_s: float,
    device_plan: DevicePlan,
    before_join: bool,
) -> int:
    check_device(device_plan)
    store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    session, epoch = _session(store, cell_id, idle_timeout_s=idle_timeout_s, before_join=before_join)
    config = Qwen2Config.from_dict(json.loads(store.get("model/config")))
    loss_fields = json.loads(store.get("loss/config"))
    packed = bool(loss_fields.pop("packed"))
    autocast_bf16 = bool(loss_fields.pop("autocast_bf16", False))
    loss_config = LossConfig(**loss_fields)
    model = place(_satellite_model(store, config), device_plan)
    released = f"released/{cell_id}/{session}"

    def is_released() -> bool:
        return bool(store.check([released]))

    computed = 0
    while True:
        plan = _next_plan(store, cell_id, epoch, idle_timeout_s=idle_timeout_s, is_released=is_released)
        if plan is None:
            return computed
        store.set(f"epoch/{plan.epoch}/ready/{cell_id}", "1")
        if _started(store, plan.epoch, timeout_s=timeout_s, is_released=is_released):
            computed += _train_epoch(
                store,
                plan,
                cell_id=cell_id,
                model=model,
                loss_config=loss_config,
                packed=packed,
                autocast_bf16=autocast_bf16,
                timeout_s=timeout_s,
                backend=device_plan.backend,
            )
        epoch = plan.epoch + 1  # also after an epoch aborted before it started


def _satellite_model(store: TCPStore, config: Qwen2Config) -> PreTrainedModel:
    """The model before its first broadcast: any weights (the broadcast overwrites them), or in a
    LoRA run the frozen base from its folder with the adapters attached (the broadcast fills them)."""
    if not store.check(["lora/config"]):
        return build_model(config, seed=0)
    spec = LoraSpec.from_json(store.get("lora/config"))
    base_folder = Path(store.get("model/base_folder").decode())
    return attach_lora(load_model(base_folder), spec, seed=0)


def _started(store: TCPStore, epoch: int, *, timeout_s: float, is_released: Callable[[], bool]) -> bool:
    """After taking up an epoch: True once the core starts it (`go`: every member is ready), False
    if it ended first (a member never got ready and was dropped) or this session was released."""
    deadline = time.monotonic() + timeout_s
    while not store.check([f"epoch/{epoch}/go"]):
        if store.check([f"epoch/{epoch}/end"]) or is_released():
            return False
        if time.monotonic() > deadline:
            raise TimeoutError(f"epoch {epoch}: the core neither started nor ended it in {timeout_s} s")
        time.sleep(POLL_S)
    return True


def _session(store: TCPStore, cell_id: str, *, idle_timeout_s: float, before_join: bool) -> tuple[int, int]:
    """This satellite's session and the first epoch it may take.

    Admitted already (a warm worker handed the rendezvous after `JoinStep`, or `--trainer`): the
    latest session, even one released since (the loop then ends at once). `before_join` (a
    process started with `--rendezvous`, possibly before its join): the first session not
    released yet, so a process started after the cell left waits for its next join.
    """
    deadline = time.monotonic() + idle_timeout_s
    while True:
        session = int(store.add(f"session/{cell_id}", 0))
        if session and not (before_join and store.check([f"released/{cell_id}/{session}"])):
            return session, int(store.get(f"join/{cell_id}/{session}"))
        if time.monotonic() > deadline:
            raise TimeoutError(f"{cell_id} was never admitted within {idle_timeout_s} s")
        time.sleep(0.01)


def _next_plan(
    store: TCPStore, cell_id: str, epoch: int, *, idle_timeout_s: float, is_released: Callable[[], bool]
) -> EpochPlan | None:
    """The first epoch from `epoch` on that names this cell; None once released.

    Epochs are walked in order (the core writes every one), so none is skipped or taken twice;
    between steps the next one may be far off, and a release ends the wait.
    """
    deadline = time.monotonic() + idle_timeout_s
    pause = POLL_S
    while True:
        if is_released():
            return None
        key = f"epoch/{epoch}"
        if store.check([key]):
            plan = EpochPlan.decode(store.get(key))
            if cell_id in plan.members:
                return plan
            epoch += 1
            pause = POLL_S
            continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"{cell_id}: no epoch {epoch} within {idle_timeout_s} s")
        time.sleep(pause)
        pause = min(IDLE_POLL_S, pause * 2)  # idle between steps: fewer store reads


def _train_epoch(
    store: TCPStore,
    plan: EpochPlan,
    *,
    cell_id: str,
    model: PreTrainedModel,
    loss_config: LossConfig,
    packed: bool,
    autocast_bf16: bool,
    timeout_s: float,
    backend: str,
) -> int:
    """One epoch: receive the weights, take microbatches until the core ends it, reduce."""
    epoch = plan.epoch
    group = make_group(
        store,
        epoch=epoch,
        rank=plan.members.index(cell_id),
        size=len(plan.members),
        timeout_s=timeout_s,
        backend=backend,
    )
    weights_P = torch.empty_like(parameters_vector(model))
    group.broadcast(weights_P, 0).wait()
    load_parameters_vector(model, weights_P)
    counters = plan.counters
    acc_P = torch.zeros_like(weights_P, dtype=torch.float64)
    end_key = f"epoch/{epoch}/end"
    computed = 0
    while not store.check([end_key]):
        if int(store.add(f"{counters}next", 0)) >= plan.num_microbatches:
            time.sleep(POLL_S)
            continue
        i = int(store.add(f"{counters}next", 1)) - 1
        if i >= plan.num_microbatches:
            continue
        result = microbatch_gradient(
            model,
            decode_microbatch(store.get(f"step/{plan.version}/mb/{i}")),
            loss_config,
            packed=packed,
            autocast_bf16=autocast_bf16,
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
    return computed
