"""What `gyre up` tells each service about the others (no process is started here)."""

from __future__ import annotations

import json
from pathlib import Path

from gyre_app.stack import REPO_ROOT, SERVICES, sandboxes_dir, service_env

PORTS = {name: 41000 + i for i, name in enumerate(SERVICES)}


def env_of(name: str, state_dir: Path = Path("/srv/gyre-state")) -> dict[str, str]:
    return service_env(name, state_dir=state_dir, ports=PORTS, proxy_http_port=42000)


def test_each_service_is_pointed_at_the_ones_it_calls_and_at_one_model_folder() -> None:
    runner, trainer, engine, proxy = env_of("runner"), env_of("trainer"), env_of("engine"), env_of("proxy")
    assert runner["GYRE_RUNNER_PROXY_ADDRESS"] == f"127.0.0.1:{PORTS['proxy']}"
    assert runner["GYRE_RUNNER_PROXY_BASE_URL"] == "http://127.0.0.1:42000"
    assert json.loads(runner["GYRE_RUNNER_HARNESS_ENV"])["GYRE_AGENT_MAX_TOKENS"] == "128"
    assert proxy["GYRE_PROXY_HTTP_PORT"] == "42000"
    assert trainer["GYRE_TRAINER_TRAJECTORY_ADDRESS"] == f"127.0.0.1:{PORTS['trajectory']}"
    assert trainer["GYRE_TRAINER_GROUPS_PER_STEP"] == "1"
    model = "/srv/gyre-state/model"
    assert (
        engine["GYRE_ENGINE_MODEL_DIR"]
        == proxy["GYRE_PROXY_MODEL_DIR"]
        == trainer["GYRE_TRAINER_MODEL_DIR"]
        == model
    )
    assert (
        engine["GYRE_ENGINE_ENGINE_ID"] == "engine-0"
        and engine["GYRE_ENGINE_CELL_ID"] == trainer["GYRE_TRAINER_CELL_ID"]
    )
    assert env_of("scheduler") == {}


def test_sandboxes_leave_shared_temp_folders_and_stay_apart_per_stack() -> None:
    assert sandboxes_dir(Path("/srv/gyre-state")) == Path("/srv/gyre-state/sandboxes")
    a, b = sandboxes_dir(Path("/tmp/a/state")), sandboxes_dir(Path("/tmp/b/state"))
    assert a.parent == b.parent == REPO_ROOT / ".gyre" / "sandboxes" and a != b
    assert Path(env_of("runner", Path("/tmp/a/state"))["GYRE_RUNNER_SANDBOX_ROOT"]) == a / "runner"
    assert Path(env_of("evaluator", Path("/tmp/a/state"))["GYRE_EVALUATOR_SANDBOX_ROOT"]) == a / "evaluator"
