"""Alembic entry point for the trainer schema (shell)."""

from gyre.db.alembic_env import run

run()
