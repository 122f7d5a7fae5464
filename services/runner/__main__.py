"""`python -m services.runner`: health and reflection only until its API lands (issue 8)."""

import sys

from gyre.launch import launch_unbuilt

sys.exit(
    launch_unbuilt(
        name="runner",
        description="Gyre runner: harness processes in sandboxed workspaces.",
    )
)
