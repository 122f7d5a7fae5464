"""`python -m services.cell`."""

import sys

from gyre.launch import launch
from services.cell.config import CellSettings
from services.cell.main import build

sys.exit(
    launch(
        name="cell",
        description="Gyre cell agent: registers the cell, beats, keeps its training worker warm.",
        settings_cls=CellSettings,
        build=build,
    )
)
