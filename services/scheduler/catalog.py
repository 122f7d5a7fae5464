"""What the cluster can run, read from the scheduler's settings and the task folder (shell)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import structlog

from services.scheduler.config import SchedulerSettings
from services.scheduler.runnable import Catalog

log = structlog.get_logger(__name__)


def load_catalog(settings: SchedulerSettings) -> Catalog:
    """Harnesses and families from the settings; each task folder's family from its task.toml."""
    task_families: dict[str, str] = {}
    root = Path(settings.tasks_dir)
    for toml in sorted(root.glob("*/task.toml")) if root.is_dir() else []:
        try:
            family = tomllib.loads(toml.read_text()).get("family")
        except (OSError, tomllib.TOMLDecodeError) as exc:
            log.warning("task_unreadable", task=toml.parent.name, error=str(exc))
            continue
        if isinstance(family, str):
            task_families[toml.parent.name] = family
    return Catalog(
        harnesses=frozenset(settings.harnesses),
        families=frozenset(settings.families),
        task_families=task_families,
    )
