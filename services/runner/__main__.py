"""`python -m services.runner`."""

import sys

from gyre.launch import launch
from services.runner.config import RunnerSettings
from services.runner.main import build

sys.exit(
    launch(
        name="runner",
        description="Gyre runner: harness processes in sandboxed workspaces; consumes ExecutionScheduled.",
        settings_cls=RunnerSettings,
        build=build,
    )
)
