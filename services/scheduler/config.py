"""Scheduler settings, env prefix GYRE_SCHEDULER_ (shell)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class SchedulerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYRE_SCHEDULER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 50051
    """gRPC port; 0 picks a free one."""
