"""`python -m services.engine`: health and reflection only until its API lands (issue 4)."""

import sys

from gyre.launch import launch_unbuilt

sys.exit(
    launch_unbuilt(
        name="engine",
        description="Gyre engine: token-in/token-out inference engine of one rollout cell.",
    )
)
