"""`python -m services.engine`."""

import sys

from gyre.launch import launch
from services.engine.config import EngineSettings
from services.engine.main import build

sys.exit(
    launch(
        name="engine",
        description=(
            "Gyre engine: token-in/token-out inference engine of one rollout cell. Settings "
            "GYRE_ENGINE_MODEL_DIR, _ENGINE_ID, _CELL_ID, _ADAPTER (torch|vllm), _MAX_BATCH, ..."
        ),
        settings_cls=EngineSettings,
        build=build,
    )
)
