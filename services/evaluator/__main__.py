"""`python -m services.evaluator`."""

import sys

from gyre.launch import launch
from services.evaluator.config import EvaluatorSettings
from services.evaluator.main import build

sys.exit(
    launch(
        name="evaluator",
        description="Gyre evaluator: grades workspaces in sandboxes; publishes RewardAssigned.",
        settings_cls=EvaluatorSettings,
        build=build,
    )
)
