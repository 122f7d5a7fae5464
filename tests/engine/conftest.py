"""Engine fixtures: one tiny model per test session, engines built in-process, gRPC servers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from gyre.runtime import ServiceHost
from gyre.settings import KernelSettings
from services.engine.config import EngineSettings
from services.engine.main import build
from services.engine.model_init import init_model

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def other_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture, other weights: its KV caches must be refused by `model_dir`'s engines."""
    return init_model(tmp_path_factory.mktemp("tiny-model-other"), seed=1)


def engine_settings(model_dir: Path, engine_id: str, **overrides: object) -> EngineSettings:
    values: dict[str, object] = {
        "model_dir": model_dir,
        "engine_id": engine_id,
        "cell_id": f"cell-{engine_id}",
        "init_model_if_missing": False,
        "publish_events": False,
        "follow_weights": False,
        "num_threads": 1,
        **overrides,
    }
    return EngineSettings(**values)  # type: ignore[arg-type]


async def start_engine(settings: EngineSettings, kernel: KernelSettings | None = None) -> ServiceHost:
    host = await build(settings, kernel or KernelSettings())
    await host.start()
    return host


@pytest_asyncio.fixture(loop_scope="session")
async def engine_pair(model_dir: Path) -> AsyncIterator[tuple[ServiceHost, ServiceHost]]:
    """Two engines serving the same checkpoint, as two rollout cells."""
    a = await start_engine(engine_settings(model_dir, "a"))
    b = await start_engine(engine_settings(model_dir, "b"))
    yield a, b
    await a.stop(0.5)
    await b.stop(0.5)
