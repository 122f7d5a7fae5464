"""Alembic entry point for the trajectory schema (shell)."""

from gyre.db.alembic_env import run

run()
