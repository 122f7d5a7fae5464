"""`python -m services.evaluator`: health and reflection only until its API lands (issue 8)."""

import sys

from gyre.launch import launch_unbuilt

sys.exit(
    launch_unbuilt(
        name="evaluator",
        description="Gyre evaluator: grading of workspaces with partial credit.",
    )
)
