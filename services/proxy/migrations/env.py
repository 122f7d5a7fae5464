"""Alembic entry point for the proxy schema (shell)."""

from gyre.db.alembic_env import run

run()
