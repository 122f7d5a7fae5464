"""Alembic entry point for the scheduler schema (shell)."""

from gyre.db.alembic_env import run

run()
