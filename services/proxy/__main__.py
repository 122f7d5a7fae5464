"""`python -m services.proxy`: health and reflection only until its API lands (issue 7)."""

import sys

from gyre.launch import launch_unbuilt

sys.exit(
    launch_unbuilt(
        name="proxy",
        description="Gyre proxy: model API for harnesses, TITO recording, routing.",
    )
)
