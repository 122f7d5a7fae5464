"""`python -m services.trainer`: health and reflection only until its API lands (issue 6)."""

import sys

from gyre.launch import launch_unbuilt

sys.exit(
    launch_unbuilt(
        name="trainer",
        description="Gyre trainer: optimizer, data-parallel satellites, weights.",
    )
)
