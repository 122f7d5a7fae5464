"""`python -m services.trajectory`."""

import sys

from gyre.launch import launch
from services.trajectory.config import TrajectorySettings
from services.trajectory.main import build

sys.exit(
    launch(
        name="trajectory",
        description=(
            "Gyre trajectory processor: consumes TaskSubmitted, LlmCallRecorded and RewardAssigned; "
            "serves GetGroup, GetCall, GetExecutionTree and StreamSamples."
        ),
        settings_cls=TrajectorySettings,
        build=build,
    )
)
