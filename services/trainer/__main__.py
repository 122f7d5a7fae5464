"""`python -m services.trainer`."""

import sys

from gyre.launch import launch
from services.trainer.config import TrainerSettings
from services.trainer.main import build

sys.exit(
    launch(
        name="trainer",
        description="Gyre trainer: streaming policy-gradient steps, satellites joining mid-step, weights.",
        settings_cls=TrainerSettings,
        build=build,
    )
)
