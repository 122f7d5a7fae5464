"""Alembic entry point for the evaluator schema (shell)."""

from gyre.db.alembic_env import run

run()
