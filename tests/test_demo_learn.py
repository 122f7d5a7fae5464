"""Pieces of `gyre demo --learn` that run without the stack (docs/tutorials/learning-demo.md: the run)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from gyre.common.v1 import envelope_pb2, ids_pb2
from gyre.events import DecodedEvent
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre_app.learn_progress import Progress, timeouts
from gyre_app.learn_run import interleave
from services.runner.agent.client import ChatClient


def test_consecutive_steps_take_the_families_in_turn() -> None:
    names = ["repair-0000", "repair-0001", "repo-gen-0000", "repo-gen-0001", "terminal-0000"]
    assert interleave(names) == [
        "repair-0000",
        "repo-gen-0000",
        "terminal-0000",
        "repair-0001",
        "repo-gen-0001",
    ]


def _timed_out(execution_id: str, limit: int) -> DecodedEvent:
    ref = ids_pb2.ExecutionRef(execution_id=execution_id)
    return DecodedEvent(
        envelope=envelope_pb2.Envelope(), payload=runner_events.ExecutionTimedOut(execution=ref, limit=limit)
    )


def test_progress_tells_the_policys_timeouts_from_the_deadlines_by_task() -> None:
    budget, deadline = runner_events.TIMEOUT_LIMIT_HARNESS_BUDGET, runner_events.TIMEOUT_LIMIT_DEADLINE
    progress = Progress({"a0": 0, "a1": 0, "b0": 1, "z0": 5, "z1": 5})
    replaced = scheduler_events.ExecutionReplacementDecided(
        execution=ids_pb2.ExecutionRef(execution_id="z1"), replacement=ids_pb2.ExecutionRef(execution_id="z2")
    )
    for event in (
        _timed_out("a0", budget),
        _timed_out("a1", budget),
        _timed_out("b0", deadline),
        _timed_out("stranger", budget),  # another run's execution: not counted
        DecodedEvent(envelope=envelope_pb2.Envelope(), payload=replaced),
        _timed_out("z2", budget),  # the replacement counts for its original's task
    ):
        progress.see(event)
    assert progress.counts["timed out"] == 4 and progress.counts["replaced"] == 1
    assert timeouts(progress, steps=6) == {
        "timed_out_turn_budget": 3,
        "timed_out_deadline": 1,
        "out_of_turns_first": 2,
        "out_of_turns_last": 1,
    }


@pytest.fixture
def endpoint() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A chat endpoint on 127.0.0.1 that records each request body and answers "done"."""
    bodies: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            answer = json.dumps({"choices": [{"message": {"role": "assistant", "content": "done"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            return

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", bodies
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(("temperature", "sent"), [(0.5, 0.5), (None, "absent")])
def test_the_agent_sends_its_temperature_only_when_configured(
    endpoint: tuple[str, list[dict[str, Any]]], temperature: float | None, sent: object
) -> None:
    url, bodies = endpoint
    client = ChatClient(base_url=url, api_key="k", model="m", temperature=temperature)
    client.complete([{"role": "user", "content": "hi"}], role="main", agent_id="main")
    assert bodies[0].get("temperature", "absent") == sent


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        (["--mode", "nope"], 2, "--mode: one of colocate, async, gyre, burst, got 'nope'"),
        (["--families", "poetry"], 2, "family: unknown family poetry: expected repo-gen, repair, terminal"),
        (["--count", "8"], 2, "--count 8 of 1 families gives 6 training and 2 held-out instances"),
    ],
)
def test_bad_options_are_refused_naming_them_before_anything_starts(
    args: list[str], code: int, expected: str
) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "gyre_app.cli", "demo", "--learn", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == code
    assert expected in done.stderr
