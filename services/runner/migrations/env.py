"""Alembic entry point for the runner schema (shell)."""

from gyre.db.alembic_env import run

run()
