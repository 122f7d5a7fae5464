"""What `gyre up` tells each service about the others (no process is started here)."""

from __future__ import annotations

import json
from pathlib import Path

from gyre_app.stack import REPO_ROOT, processes, sandboxes_dir, service_env

PORTS = {name: 41000 + i for i, (name, _) in enumerate(processes(3))}


def env_of(name: str, state_dir: Path = Path("/srv/gyre-state")) -> dict[str, str]:
    return service_env(name, state_dir=state_dir, ports=PORTS, proxy_http_port=42000)


def test_each_service_is_pointed_at_the_ones_it_calls_and_at_one_model_folder() -> None:
    runner, trainer, engine, proxy = (
        env_of("runner"),
        env_of("trainer"),
        env_of("engine-cell-1"),
        env_of("proxy"),
    )
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
    assert engine["GYRE_ENGINE_ENGINE_ID"] == "engine-cell-1" and engine["GYRE_ENGINE_CELL_ID"] == "cell-1"
    assert trainer["GYRE_TRAINER_CELL_ID"] == "cell-0"


def test_the_scheduler_drives_the_cells_and_each_agent_knows_its_cell() -> None:
    scheduler = env_of("scheduler")
    assert scheduler["GYRE_SCHEDULER_PROXY_ADDRESS"] == f"127.0.0.1:{PORTS['proxy']}"
    assert scheduler["GYRE_SCHEDULER_RUNNER_ADDRESS"] == f"127.0.0.1:{PORTS['runner']}"
    assert scheduler["GYRE_SCHEDULER_MODE"] == "gyre"
    core, satellite = env_of("cell-0"), env_of("cell-2")
    assert (
        core["GYRE_CELL_CORE"] == "true"
        and core["GYRE_CELL_TRAINER_ADDRESS"] == f"127.0.0.1:{PORTS['trainer']}"
    )
    assert satellite["GYRE_CELL_ENGINE_ADDRESS"] == f"127.0.0.1:{PORTS['engine-cell-2']}"
    assert core["GYRE_CELL_SCHEDULER_ADDRESS"] == satellite["GYRE_CELL_SCHEDULER_ADDRESS"]


def test_processes_start_engines_first_and_cell_agents_last() -> None:
    names = [name for name, _ in processes(3)]
    assert names[:2] == ["engine-cell-1", "engine-cell-2"]
    assert names[-3:] == ["cell-0", "cell-1", "cell-2"]


def test_sandboxes_leave_shared_temp_folders_and_stay_apart_per_stack() -> None:
    assert sandboxes_dir(Path("/srv/gyre-state")) == Path("/srv/gyre-state/sandboxes")
    a, b = sandboxes_dir(Path("/tmp/a/state")), sandboxes_dir(Path("/tmp/b/state"))
    assert a.parent == b.parent == REPO_ROOT / ".gyre" / "sandboxes" and a != b
    assert Path(env_of("runner", Path("/tmp/a/state"))["GYRE_RUNNER_SANDBOX_ROOT"]) == a / "runner"
    assert Path(env_of("evaluator", Path("/tmp/a/state"))["GYRE_EVALUATOR_SANDBOX_ROOT"]) == a / "evaluator"
