"""`python -m services.proxy`."""

import sys

from gyre.launch import launch
from services.proxy.config import ProxySettings
from services.proxy.main import build

sys.exit(
    launch(
        name="proxy",
        description="Gyre proxy: OpenAI and Anthropic APIs, TITO recording, routing, migration.",
        settings_cls=ProxySettings,
        build=build,
    )
)
