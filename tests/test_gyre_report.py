"""`gyre report` on a small real run: the scheduler, trajectory service and trainer (a real torch
model) in-process on real NATS and Postgres, the command run as users run it (a subprocess).

The test publishes each execution's model call and grade as the proxy and the evaluator would
(those services and the engine are not started here): two training tasks of run `r1` whose
reward rises from 0.25 to 0.75, graded by two weighted checks, and one held-out task scored at
version 0. The page is then opened in headless Chromium (Debian's `chromium`), which must show
every picture and log no error."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from headless_page import CHROMIUM, open_page
from test_gyre_command import closed_port
from trainer_stack import connect_bus, eventually, fresh_kernel, start_trainer, submit_group

from gyre.evaluator.v1 import evaluator_pb2
from gyre.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from gyre.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from services.scheduler.config import SchedulerSettings
from services.scheduler.main import build as build_scheduler
from services.trajectory.config import TrajectorySettings
from services.trajectory.main import build as build_trajectory

pytestmark = pytest.mark.asyncio(loop_scope="session")
REPO = Path(__file__).resolve().parents[1]


def graded(f2p: float) -> tuple[evaluator_pb2.CheckResult, ...]:
    """A repair grade: fail_to_pass (weight 0.5) at `f2p`, pass_to_pass (0.5) passed."""
    return (
        evaluator_pb2.CheckResult(name="fail_to_pass", weight=0.5, score=f2p),
        evaluator_pb2.CheckResult(name="pass_to_pass", weight=0.5, score=1.0),
    )


@dataclass
class Run:
    env: dict[str, str]
    tmp: Path


async def gyre(run: Run, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gyre_app.cli", *args,
        cwd=REPO, env=run.env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=180)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def run(server_urls: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Run]:
    tmp = tmp_path_factory.mktemp("gyre-report")
    async with fresh_kernel(*server_urls) as kernel:
        trajectory_port = closed_port()
        trainer = await start_trainer(kernel, f"127.0.0.1:{trajectory_port}", tmp / "trainer")
        scheduler = await build_scheduler(SchedulerSettings(port=0), kernel)
        trajectory = await build_trajectory(TrajectorySettings(port=trajectory_port), kernel)
        await scheduler.start()
        await trajectory.start()
        bus = await connect_bus(kernel)
        sch = grpc.aio.insecure_channel(scheduler.address)
        trn = grpc.aio.insecure_channel(trainer.address)
        try:
            plan = [  # (labels, scores, fail_to_pass scores)
                ({"run": "r1", "split": "train"}, (0.5, 0.0), (0.0, 0.0)),
                ({"run": "r1", "split": "heldout", "heldout_at": "0"}, (0.5, 0.5), (0.0, 0.0)),
                ({"run": "r1", "split": "train"}, (1.0, 0.5), (1.0, 0.0)),
            ]
            for version, (labels, scores, f2p) in enumerate(plan, start=1):
                request = scheduler_pb2.SubmitTasksRequest(
                    request_id=f"r-{uuid.uuid4().hex[:8]}",
                    tasks=[
                        scheduler_pb2.TaskSpec(
                            name=f"t{version}", family="terminal", prompt="2+2?", group_size=2,
                            timeout_s=60, harness="gyre-agent", labels=labels,
                        )
                    ],
                )  # fmt: skip
                task = (await scheduler_pb2_grpc.SchedulerServiceStub(sch).SubmitTasks(request)).tasks[0]
                await submit_group(
                    bus, trajectory.address, index=version, task=task, scores=scores,
                    checks=(graded(f2p[0]), graded(f2p[1])),
                )  # fmt: skip

                async def stepped(version: int = version) -> bool:
                    status = await trainer_pb2_grpc.TrainerServiceStub(trn).GetStatus(
                        trainer_pb2.GetStatusRequest()
                    )
                    return int(status.version.steps) >= version

                await eventually(stepped, timeout_s=90, what=f"step {version}")
            env = {
                **os.environ,
                "GYRE_STATE_DIR": str(tmp / "no-stack"),
                "GYRE_NATS_URL": kernel.nats_url or "",
                "GYRE_DATABASE_URL": kernel.database_url or "",
                "GYRE_BUS_PREFIX": kernel.bus_prefix,
                "GYRE_SCHEDULER_ADDRESS": scheduler.address,
                "GYRE_TRAJECTORY_ADDRESS": trajectory.address,
                "GYRE_TRAINER_ADDRESS": trainer.address,
            }
            yield Run(env=env, tmp=tmp)
        finally:
            await sch.close(None)
            await trn.close(None)
            await bus.close()
            await trainer.stop()
            await trajectory.stop()
            await scheduler.stop()


async def test_the_report_draws_the_runs_pictures_and_prints_its_summary(run: Run) -> None:
    out = run.tmp / "out" / "report.html"
    rc, stdout, err = await gyre(run, "report", "--run", "r1", "--out", str(out), "--json")
    assert rc == 0, err
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3
    assert summary["reward_first"] == pytest.approx(0.5)  # steps 1 and 3 (step 2 trained held-out only)
    assert summary["reward_last"] == pytest.approx(0.5)
    assert summary["heldout_first"] == pytest.approx(0.5)
    assert summary["num_grades"] == 6
    page = out.read_text()
    titles = re.findall(r"<img alt='([^']+)' src='data:image/png;base64,", page)
    assert titles == [
        "Reward per step",
        "Held-out score",
        "Staleness",
        "Partial credit",
        "Execution tree",
    ]
    assert "cells" in summary["not_drawn"]  # main's scheduler has no cells yet, or published none here


async def test_partial_credit_is_broken_down_by_check(run: Run) -> None:
    rc, stdout, err = await gyre(run, "report", "--run", "r1", "--out", str(run.tmp / "c.html"), "--json")
    assert rc == 0, err
    checks = json.loads(stdout.strip().splitlines()[-1])["checks"]
    # fail_to_pass passed in 1 of the 6 grades; pass_to_pass in all of them
    assert checks == {
        "fail_to_pass": {"weight": 0.5, "mean_score": pytest.approx(1 / 6, abs=1e-6)},
        "pass_to_pass": {"weight": 0.5, "mean_score": 1.0},
    }


async def test_a_run_that_does_not_exist_is_one_line_and_writes_nothing(run: Run) -> None:
    folder = run.tmp / "missing"
    folder.mkdir()
    rc, _, err = await gyre(run, "report", "--run", "nope", "--out", str(folder / "r.html"))
    assert rc == 1
    assert err.strip() == (
        "gyre report: no run 'nope': no task submitted under this bus prefix is labelled run=nope"
    )
    assert list(folder.iterdir()) == []


needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Debian's `chromium` package (apt-get install -y chromium)"
)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def page(run: Run) -> Path:
    """`gyre report`'s page of run r1, written once for the browser tests."""
    out = run.tmp / "browser" / "report.html"
    rc, _, err = await gyre(run, "report", "--run", "r1", "--out", str(out))
    assert rc == 0, err
    return out


@needs_chromium
async def test_the_page_opens_in_a_browser_with_every_picture_and_a_summary_first(page: Path) -> None:
    seen = await asyncio.to_thread(open_page, page)
    page.with_suffix(".png").write_bytes(seen.screenshot_png)  # kept in pytest's tmp, to look at
    assert seen.errors == []
    assert seen.broken_images == []
    assert seen.num_images == 5
    opening = seen.text.split("Reward per step")[0]  # what a person reads before the first picture
    assert "{" not in opening  # a summary in words, not a JSON dump
    assert "run r1: 3 training steps (policy v1 -> v3), 6 graded executions" in opening
    assert "0.250 at v1 -> 0.750 at v3 (+0.500)" in opening  # step 2 trained held-out tasks only
    assert "0.500 at v0, scored once" in opening  # the held-out score
    assert "none: every execution finished and was graded" in opening


def broken_copy(page: Path) -> Path:
    """`page` with its staleness picture's PNG cut to garbage and a script that logs an error."""
    head, tail = page.read_text().split("alt='Staleness' src='data:image/png;base64,", 1)
    broken = head + "alt='Staleness' src='data:image/png;base64,AAAA" + tail[tail.index("'") :]
    broken = broken.replace("</body>", "<script>console.error('the chart failed')</script></body>")
    bad = page.with_name("broken.html")
    bad.write_text(broken)
    return bad


@needs_chromium
async def test_the_browser_check_catches_a_broken_picture_and_a_console_error(page: Path) -> None:
    """The same page broken on purpose: the check above must see both faults."""
    bad = await asyncio.to_thread(broken_copy, page)
    seen = await asyncio.to_thread(open_page, bad)
    assert seen.broken_images == ["Staleness"]
    assert seen.errors == ["console.error: the chart failed"]
