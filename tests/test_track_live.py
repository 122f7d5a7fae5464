"""The tracker on the real bus: a two-step run's events in, one row per step and ATIF files out.

The events are the services' own protobufs, published on a real NATS JetStream the way each
service publishes them (its stream, its subject); the tokenizer is a real one (`gyre model init`).
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gyre.bus import Bus
from gyre.common.v1 import ids_pb2
from gyre.devstack.processes import is_our_process, read_json, write_json
from gyre.evaluator.v1 import evaluator_pb2
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import new_event
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.proxy.v1 import proxy_pb2
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.settings import KernelSettings, stack_state_path
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre_app.cli import main as gyre_main
from gyre_app.stack import REPO_ROOT
from gyre_app.track_config import TrackSettings
from gyre_app.track_follow import MARKER, follow, start_tracker, stop_tracker
from services.engine.model_init import init_model

TOOL_OUTPUT = 'Let me look.<tool_call>{"name": "ls", "arguments": {"path": "."}}</tool_call>'
BROKEN_OUTPUT = "<tool_call>{not json</tool_call>"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model(tmp_path_factory.mktemp("track-model") / "model", seed=1, hidden_size=32, num_layers=1)


async def publish_group(
    bus: Bus, tokenizer: object, task_id: str, rewards: list[float], version: int
) -> None:
    """One task's executions as the runner, proxy and evaluator publish them, then the step."""
    encode = tokenizer.encode  # type: ignore[attr-defined]
    for index, reward in enumerate(rewards):
        execution_id = f"{task_id}-e{index}"
        ref = ids_pb2.ExecutionRef(task_id=task_id, execution_id=execution_id, index_in_group=index)
        record = proxy_pb2.CallRecord(
            execution_id=execution_id,
            call_id=f"{execution_id}-c0",
            agent_id="main",
            full_prompt=proxy_pb2.FullPrompt(prompt_ids=encode("fix the failing test")),
            output_ids=encode(TOOL_OUTPUT if reward else BROKEN_OUTPUT),
            finish_reason=proxy_pb2.CALL_FINISH_REASON_STOP,
        )
        record.started_at.FromSeconds(1_000 + index)
        record.finished_at.FromSeconds(1_002 + index)
        events = [
            (proxy_events.LlmCallRecorded(call=record), "proxy"),
            (runner_events.ExecutionFinished(execution=ref, family="terminal"), "runner"),
            (
                evaluator_events.RewardAssigned(
                    grade=evaluator_pb2.Grade(
                        execution_id=execution_id, task_id=task_id, score=reward, assessable=True
                    )
                ),
                "evaluator",
            ),
        ]
        for payload, producer in events:
            await bus.publish(new_event(payload, producer=producer, correlation_id=task_id))
    step = trainer_events.StepCompleted(
        version=ids_pb2.PolicyVersion(steps=version),
        num_groups_consumed=1,
        task_ids=[task_id],
        num_samples=len(rewards),
        num_target_tokens=64,
        duration_s=0.5,
    )
    await bus.publish(new_event(step, producer="trainer", correlation_id=task_id))


@pytest.mark.asyncio(loop_scope="session")
async def test_the_tracker_writes_one_row_per_step_with_samples_and_atif(
    own_bus: Bus, model_dir: Path, tmp_path: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    await publish_group(own_bus, tokenizer, f"task-{uuid.uuid4().hex[:6]}", [1.0, 0.0], version=1)
    await publish_group(own_bus, tokenizer, f"task-{uuid.uuid4().hex[:6]}", [1.0, 1.0], version=2)
    polls: list[int] = []

    def once(_: list[int]) -> bool:
        polls.append(1)
        return len(polls) == 1

    settings = TrackSettings(run_name="live", poll_s=0.1)
    result = await follow(
        own_bus, settings, tmp_path, sinks=("jsonl", "tensorboard"), tokenizer_dir=model_dir, keep_going=once
    )
    assert result.steps == [1, 2] and result.failures == {}
    rows = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["reward/mean"] == 0.5 and rows[0]["solve_partial"] == 1.0
    assert rows[1]["solve_all"] == 1.0 and rows[1]["pass_at_1"] == 1.0
    assert rows[0]["tool_call/parse_errors"] == 1.0 and rows[1]["tool_call/parse_errors"] == 0.0
    assert rows[0]["termination/done"] == 1.0 and rows[0]["executions/turns_mean"] == 1.0
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    best = samples[0]
    assert best["reward"] == 1.0 and best["tool_calls"] == [{"name": "ls", "arguments": '{"path": "."}'}]
    assert "fix the failing test" in best["prompt"]
    (atif_file,) = sorted((tmp_path / "atif" / "step-00000001").glob("*-e0.json"))
    trajectory = json.loads(atif_file.read_text())
    assert [s["source"] for s in trajectory["steps"]] == ["user", "agent"]
    assert trajectory["steps"][1]["tool_calls"][0]["function_name"] == "ls"
    assert json.loads((tmp_path / "status.json").read_text())["rows_logged"] == {"jsonl": 2, "tensorboard": 2}


@pytest.mark.asyncio(loop_scope="session")
async def test_the_tracker_process_follows_a_stack_and_exits_when_it_is_gone(
    own_bus: Bus, model_dir: Path, tmp_path: Path, server_urls: tuple[str, str]
) -> None:
    """What `gyre up` starts: the detached process, its rows as steps complete, its exit at `gyre down`."""
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    write_json(stack_state_path(state_dir), {"nats_url": "", "services": []})
    kernel = KernelSettings(state_dir=state_dir, bus_prefix=own_bus.prefix)
    env = {
        **os.environ,
        "GYRE_NATS_URL": server_urls[0],
        "GYRE_TRACK_TOKENIZER_DIR": str(model_dir),
        "GYRE_TRACK_POLL_S": "0.2",
    }
    folder = start_tracker(kernel, env, REPO_ROOT, sinks=("jsonl",))
    pid = read_json(state_dir / "tracker.json")["pid"]  # type: ignore[index]
    assert start_tracker(kernel, env, REPO_ROOT, sinks=("jsonl",)) == folder  # a repeated `gyre up`
    assert read_json(state_dir / "tracker.json")["pid"] == pid  # type: ignore[index]
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        await publish_group(own_bus, tokenizer, "task-p1", [1.0, 0.0], version=1)
        rows_file = folder / "steps.jsonl"
        for _ in range(600):  # bounded: the process imports transformers before its first poll
            if rows_file.exists() and rows_file.read_text().count("\n") == 1:
                break
            await asyncio.sleep(0.1)
        assert [json.loads(line)["step"] for line in rows_file.read_text().splitlines()] == [1]
        stack_state_path(state_dir).unlink()  # what `gyre down` does last
        for _ in range(300):
            if not is_our_process(pid, MARKER):
                break
            await asyncio.sleep(0.1)
        assert not is_our_process(pid, MARKER)
    finally:
        stop_tracker(state_dir)


def test_gyre_up_refuses_an_unknown_tracker_before_starting_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GYRE_STATE_DIR", str(tmp_path / "state"))
    assert gyre_main(["up", "--track", "wandb,neptune"]) == 2  # an input error, as every gyre command's
    assert capsys.readouterr().err.strip() == (
        "gyre up: --track: unknown tracker 'neptune'; "
        "known: jsonl, tensorboard, wandb, mlflow, trackio, or none"
    )
    assert not (tmp_path / "state").exists()
