"""Mutual TLS in the kernel (gyre.tls), server passwords in URLs, and log redaction: in-process."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gyre.errors import InvalidArgument
from gyre.logs import redact, redact_secrets
from gyre.rpc import GrpcServer
from gyre.settings import KernelSettings, resolve_urls
from gyre.tls import aio_channel, material
from gyre_app.secure import make_keys, process_tls_env


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tls") / "secure"
    make_keys(folder, ["scheduler", "other"])
    return folder


def _use(monkeypatch: pytest.MonkeyPatch, folder: Path, name: str) -> None:
    for key, value in process_tls_env(folder.parent, name).items():
        monkeypatch.setenv(key, value)


async def _health(channel: grpc.aio.Channel) -> str:
    try:
        answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    except grpc.aio.AioRpcError as exc:
        return exc.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status)


async def test_a_tls_server_answers_a_client_of_the_same_ca_and_refuses_plaintext(
    keys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, keys, "scheduler")
    server = GrpcServer(service_names=[], host="127.0.0.1", port=0)
    await server.start()
    try:
        _use(monkeypatch, keys, "other")  # another service of the same CA, as the client
        async with aio_channel(server.address) as channel:
            assert await _health(channel) == "SERVING"
        async with grpc.aio.insecure_channel(server.address) as plain:
            assert await _health(plain) == "UNAVAILABLE"
        ca = (keys / "ca.pem").read_bytes()
        async with grpc.aio.secure_channel(server.address, grpc.ssl_channel_credentials(ca)) as anonymous:
            assert await _health(anonymous) == "UNAVAILABLE"
    finally:
        await server.stop(0)


async def test_a_client_of_another_ca_is_refused(
    keys: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use(monkeypatch, keys, "scheduler")
    server = GrpcServer(service_names=[], host="127.0.0.1", port=0)
    await server.start()
    try:
        stranger = tmp_path / "secure"
        make_keys(stranger, ["scheduler"])
        _use(monkeypatch, stranger, "scheduler")
        async with aio_channel(server.address) as channel:
            assert await _health(channel) == "UNAVAILABLE"
    finally:
        await server.stop(0)


def test_half_a_tls_configuration_is_refused_naming_the_setting(
    keys: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYRE_TLS_CA_FILE", str(keys / "ca.pem"))
    monkeypatch.delenv("GYRE_TLS_CERT_FILE", raising=False)
    monkeypatch.delenv("GYRE_TLS_KEY_FILE", raising=False)
    with pytest.raises(InvalidArgument) as refused:
        material()
    assert refused.value.field == "GYRE_TLS_CERT_FILE"


def test_password_files_complete_the_server_urls(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret-Pw\n")
    kernel = KernelSettings(
        nats_url="nats://gyre@nats:4222",
        database_url="postgresql+asyncpg://postgres@pg:5432/gyre",
        nats_password_file=secret,
        database_password_file=secret,
    )
    urls = resolve_urls(kernel)
    assert urls.nats_url == "nats://gyre:s3cret-Pw@nats:4222"
    assert urls.database_url == "postgresql+asyncpg://postgres:s3cret-Pw@pg:5432/gyre"


def test_log_lines_hide_url_passwords_bearer_tokens_and_secret_fields() -> None:
    assert (
        redact("nats://gyre:pw1@h:4222 postgresql://u:pw2@h/db")
        == "nats://gyre:***@h:4222 postgresql://u:***@h/db"
    )
    assert redact("Authorization: Bearer abc.def") == "Authorization: Bearer ***"
    event = redact_secrets(None, "info", {"event": "x", "token": "abc", "error": "OSError(nats://a:b@h:1)"})
    assert event == {"event": "x", "token": "***", "error": "OSError(nats://a:***@h:1)"}
