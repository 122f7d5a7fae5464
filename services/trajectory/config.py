"""Trajectory settings, env prefix GYRE_TRAJECTORY_ (shell)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class TrajectorySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYRE_TRAJECTORY_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 50055
    """gRPC port; 0 picks a free one."""
    tree_cache_size: int = 32
    """Execution trees kept in memory (a 1M-token tree is about 20 MB)."""
