"""Scheduler settings, env prefix GYRE_SCHEDULER_ (shell)."""

from __future__ import annotations

from typing import Literal

from pydantic_settings import BaseSettings, SettingsConfigDict


class SchedulerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYRE_SCHEDULER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 50051
    """gRPC port; 0 picks a free one."""
    proxy_address: str = ""
    """The proxy's gRPC `host:port`: cells are routed and drained through it (empty: no switching)."""
    mode: Literal["colocate", "async", "gyre", "burst"] = "gyre"
    """Scheduling mode at the first start (later: SetMode; the stored mode wins on restart)."""
    cell_lost_after_s: float = 5.0
    """A cell whose heartbeat is silent this long is declared lost."""
    drain_timeout_s: float = 30.0
    """How long a rollout -> training switch waits for the proxy to move the cell's calls."""
