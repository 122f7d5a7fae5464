"""`python -m services.scheduler`."""

import sys

from gyre.launch import launch
from services.scheduler.config import SchedulerSettings
from services.scheduler.main import build

sys.exit(
    launch(
        name="scheduler",
        description="Gyre scheduler: SubmitTasks, task queries; publishes TaskSubmitted.",
        settings_cls=SchedulerSettings,
        build=build,
    )
)
