"""`gyre up --secure`, `gyre demo`, `gyre down` on the embedded servers: the whole loop runs over
mutual TLS with password-protected NATS and Postgres, what it refuses (plaintext gRPC, clients
without a certificate or a password) is refused, no log line holds a secret the run used, then
everything stops. One run of the stack serves every test here, in file order."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import grpc
import nats
import nats.errors
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from sqlalchemy.engine import make_url

from gyre.db.engine import libpq_url
from gyre.devstack.processes import pid_running
from gyre.settings import stack_state_path
from gyre_app.stack import DEFAULT_CELLS, StackState, load_state, processes, sandboxes_dir

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoRun:
    root: Path
    env: dict[str, str]
    out: str
    err: str
    returncode: int
    state: StackState | None


def gyre(run_env: dict[str, str], *args: str, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gyre_app.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=run_env,
        cwd=REPO_ROOT,
    )


@pytest.fixture(scope="module")
def secure_demo() -> Iterator[DemoRun]:
    """`gyre up --secure`, then `gyre demo --keep` on it: the whole loop over mutual TLS, NATS and
    Postgres with passwords. The state folder is ours right under /tmp rather than in pytest's:
    pytest locks its temp root (0700) whenever any pytest session starts on this machine, which
    would shut the embedded PostgreSQL's own account out of its data folder mid-run."""
    root = Path(tempfile.mkdtemp(prefix="gyre-e2e-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    env["GYRE_STATE_DIR"] = str(root / "state")
    try:
        up = gyre(env, "up", "--secure")
        assert up.returncode == 0, up.stdout + up.stderr
        done = gyre(env, "demo", "--keep")
        state = load_state(root / "state")
        yield DemoRun(
            root=root, env=env, out=done.stdout, err=done.stderr, returncode=done.returncode, state=state
        )
    finally:
        # `up` records the stack before it starts anything and `down` forgets it last: with no
        # record the last test stopped it all, and a `gyre down` would cost seconds for nothing.
        if stack_state_path(root / "state").exists():
            gyre(env, "down", timeout_s=120)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.e2e
@pytest.mark.slow
def test_the_demo_closes_the_loop_on_a_secure_stack(secure_demo: DemoRun) -> None:
    state, out = secure_demo.state, secure_demo.out
    assert secure_demo.returncode == 0, out + secure_demo.err
    assert "on embedded servers" in out
    assert state is not None and [s.name for s in state.services] == [n for n, _ in processes(DEFAULT_CELLS)]
    assert state.mode == "gyre"
    assert state.tls["cert_file"].endswith("client.pem")
    assert state.proxy_http_url.startswith("http://127.0.0.1:") and state.proxy_http_url in out
    assert all(pid_running(s.pid) for s in state.services)
    # The loop of DESIGN section 3, stage by stage, for the first group.
    stages = [
        r"runner +ExecutionStarted",
        r"proxy +LlmCallRecorded .* policy v0 on engine-cell-\d",  # served by a satellite
        r"evaluator +RewardAssigned .* reward \d\.\d\d = fail_to_pass",
        r"trajectory +GroupReady +task",
        r"trainer +StepCompleted +v1: 1 group\(s\), [1-9]\d* samples",
        r"trainer +WeightsPublished +v1",
        r"engine +EngineWeightsUpdated +engine-cell-\d: v0 -> v1",
        r"GetExecutionTree +…\w+: [1-9]\d* calls, [1-9]\d* trajectories",
        r"proxy +LlmCallRecorded .* policy v1 on engine-cell-\d",  # the next group: new version
        r"engine now at policy v1",
    ]
    for stage in stages:
        assert re.search(stage, out), f"{stage!r} not in\n{out}"
    assert len(re.findall(r"runner +ExecutionStarted", out)) >= 2
    assert "INVALID_ARGUMENT: tasks[0].family" in out


def _health(channel: grpc.Channel) -> str:
    try:
        answer = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    except grpc.RpcError as exc:
        return exc.code().name  # type: ignore[no-any-return]
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


@pytest.mark.e2e
@pytest.mark.slow
def test_every_service_refuses_plaintext_and_clients_without_a_certificate(secure_demo: DemoRun) -> None:
    state = secure_demo.state
    assert state is not None and state.tls
    ca = Path(state.tls["ca_file"]).read_bytes()
    key, cert = Path(state.tls["key_file"]).read_bytes(), Path(state.tls["cert_file"]).read_bytes()
    for service in state.services:
        with grpc.insecure_channel(service.address) as plain:
            assert _health(plain) == "UNAVAILABLE", service.name
        with grpc.secure_channel(service.address, grpc.ssl_channel_credentials(ca)) as anonymous:
            assert _health(anonymous) == "UNAVAILABLE", service.name
        with grpc.secure_channel(service.address, grpc.ssl_channel_credentials(ca, key, cert)) as ours:
            assert _health(ours) == "SERVING", service.name


@pytest.mark.e2e
@pytest.mark.slow
async def test_nats_and_postgres_refuse_clients_without_the_password(secure_demo: DemoRun) -> None:
    state = secure_demo.state
    assert state is not None
    nats_url, database_url = (
        make_url(state.nats_url.replace("nats://", "postgresql://")),
        make_url(state.database_url),
    )
    assert nats_url.password and database_url.password
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            f"nats://{nats_url.host}:{nats_url.port}",
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=5,
        )
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(f"postgresql://postgres@{database_url.host}:{database_url.port}/gyre")
    with pytest.raises(asyncpg.InvalidPasswordError):
        await asyncpg.connect(f"postgresql://postgres:wrong@{database_url.host}:{database_url.port}/gyre")


def _log_files(run: DemoRun) -> list[Path]:
    state_dir = run.root / "state"
    folders = [state_dir, sandboxes_dir(state_dir)]
    return [p for folder in folders for p in folder.rglob("*.log") if p.is_file()]


@pytest.mark.e2e
@pytest.mark.slow
async def test_no_log_line_holds_a_password_a_key_or_an_execution_token(secure_demo: DemoRun) -> None:
    """Every log of the run (services, servers, harness sandboxes, the command's own output) is
    searched for the servers' passwords, the private keys, and every execution token the runner
    handed a harness: the proxy keeps only their SHA-256, so every token-shaped word of every log
    is hashed and looked up."""
    state = secure_demo.state
    assert state is not None
    secure = secure_demo.root / "state" / "secure"
    secrets = [(secure / f).read_text().strip() for f in ("nats.password", "postgres.password")]
    for key_file in secure.glob("*.key"):
        body = [line for line in key_file.read_text().splitlines() if line and not line.startswith("-----")]
        secrets += body
    conn = await asyncpg.connect(libpq_url(state.database_url))
    try:
        digests = {bytes(r[0]) for r in await conn.fetch("SELECT token_sha256 FROM proxy.execution_tokens")}
    finally:
        await conn.close()
    assert len(digests) >= 4  # two groups of two executions ran
    texts = {path: path.read_text(errors="replace") for path in _log_files(secure_demo)}
    texts[Path("gyre demo")] = secure_demo.out + secure_demo.err
    assert any(p.name == "proxy.log" for p in texts) and any(p.name == "postgres.log" for p in texts)
    for path, text in texts.items():
        # Booleans, so that a failure names the file without printing the secret again.
        leaked = [i for i, secret in enumerate(secrets) if secret in text]
        assert not leaked, f"secret #{leaked[0]} of {secure} is in {path}"
        words = re.findall(r"[A-Za-z0-9_-]{32,256}", text)
        tokens = [w for w in words if hashlib.sha256(w.encode()).digest() in digests]
        assert not tokens, f"{len(tokens)} execution token(s) in {path}"


@pytest.mark.e2e
@pytest.mark.slow
def test_gyre_down_stops_everything_it_started(secure_demo: DemoRun) -> None:
    """Last in this file: it stops the stack the tests above share."""
    state = secure_demo.state
    stop = gyre(secure_demo.env, "down", timeout_s=120)
    assert stop.returncode == 0, stop.stderr
    names = [n for n, _ in reversed(processes(DEFAULT_CELLS))]
    assert stop.stdout.strip() == f"stopped: {', '.join([*names, 'nats', 'postgres'])}"
    assert state is not None and not any(pid_running(s.pid) for s in state.services)
    assert load_state(secure_demo.root / "state") is None
    assert not sandboxes_dir(secure_demo.root / "state").exists()
    # No sandboxed harness outlives the stack: every process of ours is gone with its service.
    leftovers = subprocess.run(["pgrep", "-f", str(secure_demo.root)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", leftovers.stdout
