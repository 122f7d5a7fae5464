"""The evaluator: task format, partial credit, sandboxed grading, `gyre evaluate`, reward events."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import nats
import nats.js.errors
import pytest
import pytest_asyncio

from gyre.bus import Bus, BusConfig
from gyre.common.v1 import envelope_pb2, ids_pb2
from gyre.errors import InvalidArgument
from gyre.evaluator.v1 import evaluator_pb2, evaluator_pb2_grpc, events_pb2
from gyre.events import new_event, stream_name
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.runner.v1 import runner_pb2
from gyre.sandbox import launcher
from gyre.settings import KernelSettings
from services.evaluator.cli import run as evaluate
from services.evaluator.config import EvaluatorSettings
from services.evaluator.main import build
from services.evaluator.scoring import GraderRun, parse_verdicts, score_task
from services.evaluator.taskset import BUNDLED, load_task, parse_task

REPO = Path(__file__).resolve().parent.parent
TOKENIZE = 'import re\n\ndef words(text):\n    return re.findall(r"[a-z\']+", text.lower())\n'
COUNT_WRONG = "def top(text, n):\n    return []\n"


def workspace(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / f"ws-{uuid.uuid4().hex[:6]}"
    root.mkdir()
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    code = evaluate([*args, "--json"])
    out = (capsys.readouterr().out.strip().splitlines() or [""])[-1]  # logs may precede it
    return code, json.loads(out) if out else None


def test_partial_credit_is_the_weighted_share_of_tests_and_finished_packages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = workspace(
        tmp_path,
        {"wordfreq/__init__.py": "", "wordfreq/tokenize.py": TOKENIZE, "wordfreq/count.py": COUNT_WRONG},
    )
    code, result = run_cli(capsys, "--task", "wordfreq", "--workspace", str(ws), "--partial")
    assert code == 0
    assert result["assessable"] is True
    # tokenize: 4/4 -> full 0.4; count: 0/3 -> 0 of 0.6
    assert result["score"] == pytest.approx(0.4)
    assert [c["outcome"] for c in result["details"]["checks"]] == ["passed", "failed"]
    assert result["details"]["partial"] is True


def test_nothing_gradeable_is_a_policy_outcome_scored_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, empty = run_cli(capsys, "--task", "wordfreq", "--workspace", str(workspace(tmp_path, {})))
    assert empty["assessable"] is True and empty["score"] == 0.0 and "empty" in empty["details"]["reason"]
    _, other = run_cli(
        capsys, "--task", "wordfreq", "--workspace", str(workspace(tmp_path, {"notes.txt": "x"}))
    )
    assert other["assessable"] is True and other["score"] == 0.0 and "wordfreq" in other["details"]["reason"]
    _, repair = run_cli(capsys, "--task", "slugfix", "--workspace", str(BUNDLED / "slugfix" / "workspace"))
    assert repair["assessable"] is True and repair["score"] == pytest.approx(0.3)  # pass-to-pass only


def test_bad_input_names_the_cause(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert evaluate(["--task", "no-such-task", "--workspace", str(tmp_path)]) == 2
    assert "no task.toml" in capsys.readouterr().err
    file = tmp_path / "file.txt"
    file.write_text("x")
    assert evaluate(["--task", "wordfreq", "--workspace", str(file)]) == 2
    assert "is not a folder" in capsys.readouterr().err


def make_task(tmp_path: Path, script: str, *, timeout_s: float = 1.0) -> Path:
    folder = tmp_path / f"task-{uuid.uuid4().hex[:6]}"
    (folder / "hidden").mkdir(parents=True)
    (folder / "hidden" / "check.sh").write_text(script)
    (folder / "task.toml").write_text(
        f'name = "probe"\nfamily = "terminal"\nprompt = "p"\nrequires = ["out.txt"]\n'
        f'grader_timeout_s = {timeout_s}\ncheck = "hidden/check.sh"\n'
    )
    return folder


def test_a_workspace_that_hangs_the_grader_scores_0_once_and_a_check_that_fails_is_not_retried(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYRE_EVALUATOR_ATTEMPTS", "2")
    ws = workspace(tmp_path, {"out.txt": "1"})
    _, hung = run_cli(capsys, "--task", str(make_task(tmp_path, "sleep 60\n")), "--workspace", str(ws))
    assert hung["assessable"] is True and hung["score"] == 0.0  # hanging pays no better than failing
    assert "deadline of 1 s" in hung["details"]["reason"]
    assert hung["details"]["attempts"] == 1
    # Issue 27: the check started (the host saw it), so how it ended is the graded code's doing
    # (a program it ran can make it exit 3): an assessable 0, never a retry or `not assessable`.
    task = make_task(tmp_path, "echo boom >&2; exit 3\n", timeout_s=10)
    _, crashed = run_cli(capsys, "--task", str(task), "--workspace", str(ws))
    assert crashed["assessable"] is True and crashed["score"] == 0.0
    assert crashed["details"]["attempts"] == 1 and "exit 3" in crashed["details"]["reason"]


def test_a_grading_sandbox_whose_set_up_never_reports_is_retried_then_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Set-up fails before the check exists (an init that exits before it reports): the one
    infrastructure failure of grading, proved by the host's status pipe, not by a log line."""
    monkeypatch.setenv("GYRE_EVALUATOR_ATTEMPTS", "2")
    broken = tmp_path / "init.py"
    broken.write_text("import sys\nprint('bwrap: cannot mount', file=sys.stderr)\nsys.exit(125)\n")
    monkeypatch.setattr(launcher, "INIT_SCRIPT", broken)
    ws = workspace(tmp_path, {"out.txt": "1"})
    task = make_task(tmp_path, "echo 'PASS out'\n", timeout_s=10)
    _, failed = run_cli(capsys, "--task", str(task), "--workspace", str(ws))
    assert failed["assessable"] is False and "crashed 2 times" in failed["details"]["reason"]
    assert (
        "set-up failed" in failed["details"]["reason"]
        and "bwrap: cannot mount" in failed["details"]["reason"]
    )


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"family": "math"}, "t.family"),
        ({"name": "Bad Name"}, "t.name"),
        ({"requires": []}, "t.requires"),
        ({"requires": ["../x"]}, "t.requires"),
        ({"checks": [{"name": "a", "tests": "hidden/a.py", "weight": 0.5}]}, "t.checks"),
        ({"checks": [{"name": "a", "tests": "../a.py", "weight": 1.0}]}, "t.checks[0].tests"),
        ({"grader_timeout_s": 0}, "t.grader_timeout_s"),
    ],
)
def test_malformed_task_specs_name_the_field(change: dict[str, Any], field: str) -> None:
    raw: dict[str, Any] = {
        "name": "t", "family": "repo_generation", "prompt": "p", "requires": ["x"],
        "checks": [{"name": "a", "tests": "hidden/a.py", "weight": 1.0}],
    }  # fmt: skip
    raw.update(change)
    with pytest.raises(InvalidArgument) as err:
        parse_task(raw, folder=Path("/t"), at="t")
    assert err.value.field == field


def test_bundled_tasks_load_and_score_with_the_completion_bonus() -> None:
    task = load_task("wordfreq")
    run = GraderRun(
        outcomes={
            "hidden/test_tokenize.py": ["passed"] * 3 + ["failed"],
            "hidden/test_count.py": ["passed"] * 3,
        }
    )
    assert score_task(task, run).score == pytest.approx(0.4 * 0.75 * 0.75 + 0.6)
    assert {load_task(n).family for n in ("wordfreq", "slugfix", "csvsum")} == {
        "repo_generation", "repo_repair", "terminal",
    }  # fmt: skip
    assert parse_verdicts("PASS a\nnoise\nFAIL b\n") == {"a": ["passed"], "b": ["failed"]}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def evaluator(kernel: KernelSettings) -> AsyncIterator[evaluator_pb2_grpc.EvaluatorServiceStub]:
    host = await build(EvaluatorSettings(), kernel)
    await host.start()
    channel = grpc.aio.insecure_channel(host.address)
    yield evaluator_pb2_grpc.EvaluatorServiceStub(channel)
    await channel.close()
    await host.stop()


async def rewards(kernel: KernelSettings, within_s: float = 30) -> list[events_pb2.RewardAssigned]:
    nc = await nats.connect(kernel.nats_url)
    js = nc.jetstream()
    out: list[events_pb2.RewardAssigned] = []
    try:
        try:
            info = await js.stream_info(stream_name("evaluator", prefix=kernel.bus_prefix))
        except nats.js.errors.NotFoundError:  # nothing published yet
            return out
        for seq in range(max(info.state.first_seq, 1), info.state.last_seq + 1):  # empty: 0..0
            env = envelope_pb2.Envelope()
            env.ParseFromString((await js.get_msg(info.config.name or "", seq)).data or b"")
            reward = events_pb2.RewardAssigned()
            env.payload.Unpack(reward)
            out.append(reward)
    finally:
        await nc.close()
    return out


def ref() -> ids_pb2.ExecutionRef:
    return ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=str(uuid.uuid4()))


@pytest.mark.asyncio(loop_scope="session")
async def test_runner_end_events_become_rewards(
    evaluator: evaluator_pb2_grpc.EvaluatorServiceStub, kernel: KernelSettings, tmp_path: Path
) -> None:
    ws = workspace(tmp_path, {"wordfreq/__init__.py": "", "wordfreq/tokenize.py": TOKENIZE})
    timed_out, failed, crashed, no_sandbox = ref(), ref(), ref(), ref()
    bus = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix))
    await bus.ensure_stream("runner")
    for payload in (
        runner_events.ExecutionTimedOut(
            execution=timed_out,
            workspace_uri=ws.as_uri(),
            timeout_s=5,
            family="repo_generation",
            task="wordfreq",
        ),
        runner_events.ExecutionFailed(execution=failed, family="repo_generation", task="wordfreq"),
        runner_events.ExecutionFailed(
            execution=crashed,
            failure=runner_pb2.ExecutionFailure(
                kind=runner_pb2.EXECUTION_FAILURE_KIND_HARNESS_CRASHED, reason="signal 11"
            ),
            workspace_uri=ws.as_uri(),
            exit_code=139,
            family="repo_generation",
            task="wordfreq",
        ),
        runner_events.ExecutionFailed(  # the workspace landed, then the sandbox did not start
            execution=no_sandbox,
            failure=runner_pb2.ExecutionFailure(
                kind=runner_pb2.EXECUTION_FAILURE_KIND_SANDBOX, reason="sandbox could not be created"
            ),
            workspace_uri=ws.as_uri(),
            family="repo_generation",
            task="wordfreq",
        ),
    ):
        await bus.publish(new_event(payload, producer="runner", correlation_id=payload.execution.task_id))
    await bus.close()
    by_id: dict[str, events_pb2.RewardAssigned] = {}
    for _ in range(150):  # bounded: 30 s
        by_id = {r.grade.execution_id: r for r in await rewards(kernel)}
        if {
            timed_out.execution_id,
            failed.execution_id,
            crashed.execution_id,
            no_sandbox.execution_id,
        } <= set(by_id):
            break
        await asyncio.sleep(0.2)
    partial = by_id[timed_out.execution_id].grade
    assert partial.assessable and partial.partial and partial.score == pytest.approx(0.4)
    assert [c.outcome for c in partial.checks] == [
        evaluator_pb2.CHECK_OUTCOME_PASSED,
        evaluator_pb2.CHECK_OUTCOME_ERRORED,
    ]
    left = by_id[crashed.execution_id].grade  # a crashed harness's workspace earns what it holds
    assert left.assessable and left.partial and left.score == pytest.approx(0.4)
    gone = by_id[failed.execution_id].grade
    assert not gone.assessable and "failed" in gone.unassessable_reason
    # An infrastructure failure: the policy never ran, so the template it left is not graded.
    never_ran = by_id[no_sandbox.execution_id].grade
    assert not never_ran.assessable and "sandbox could not be created" in never_ran.unassessable_reason


@pytest.mark.asyncio(loop_scope="session")
async def test_grade_workspace_publishes_once_and_refuses_bad_input(
    evaluator: evaluator_pb2_grpc.EvaluatorServiceStub, tmp_path: Path
) -> None:
    ws = tmp_path / "csv"
    shutil.copytree(BUNDLED / "csvsum" / "workspace", ws)
    (ws / "total.txt").write_text("12\n")
    execution = ref()
    request = evaluator_pb2.GradeWorkspaceRequest(
        request_id=f"g-{uuid.uuid4().hex[:6]}", execution=execution, family="terminal", task="csvsum",
        workspace_uri=ws.as_uri(), publish_reward=True,
    )  # fmt: skip
    first = await evaluator.GradeWorkspace(request)
    assert first.reward_published and first.grade.score == pytest.approx(0.5)
    assert (await evaluator.GradeWorkspace(request)) == first  # a repeat answers the first
    request.request_id = "another"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await evaluator.GradeWorkspace(request)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    for change, field in ((("task", "nope"), "task"), (("workspace_uri", "http://x"), "workspace_uri")):
        bad = evaluator_pb2.GradeWorkspaceRequest()
        bad.CopyFrom(request)
        bad.request_id = f"b-{uuid.uuid4().hex[:6]}"
        setattr(bad, *change)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await evaluator.GradeWorkspace(bad)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith(f"{field}:")
