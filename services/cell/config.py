"""Cell agent settings, env prefix GYRE_CELL_ (shell)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class CellSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYRE_CELL_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 0
    """gRPC port of the CellService; 0 picks a free one."""
    advertise_address: str = ""
    """`host:port` the scheduler reaches this agent's CellService at; empty: the address it listens
    on (right locally; on Kubernetes, where it listens on 0.0.0.0, the pod's stable DNS name)."""
    cell_id: str = "cell-1"
    scheduler_address: str = "127.0.0.1:50051"
    core: bool = False
    """The core cell: its agent registers the trainer (`trainer_address`) and keeps no worker."""
    trainer_address: str = ""
    """Core cell only: the TrainerService `host:port`."""
    engine_address: str = ""
    """Satellites: the cell's EngineService `host:port` (the engine runs as its own process)."""
    slots: int = 4
    """Concurrent executions the cell serves in the rollout role."""
    heartbeat_s: float = 0.5
    worker_threads: int = 1
    """torch threads of the training worker."""
    worker_ready_timeout_s: float = 120.0
    """How long the training worker may take to import torch before the agent gives up."""
