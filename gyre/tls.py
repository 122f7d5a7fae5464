"""Mutual TLS for gRPC between services: server credentials and channels (shell).

With `GYRE_TLS_CA_FILE`, `GYRE_TLS_CERT_FILE` and `GYRE_TLS_KEY_FILE` set, every gRPC server the
kernel builds listens with TLS only and requires a client certificate signed by that CA, and
every channel opened through `aio_channel` / `sync_channel` presents this process's certificate
and checks the server's against the CA. Unset (the local stack without `--secure`, tests), both
stay plaintext on 127.0.0.1. (The `gyre` command sets them from a `--secure` local stack's state.)

Certificates name the hosts they serve (`127.0.0.1`, `localhost`, the service's DNS names);
`GYRE_TLS_SERVER_NAME` overrides the name a client expects, for addresses no certificate names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
from pydantic_settings import BaseSettings, SettingsConfigDict

from gyre.errors import InvalidArgument

Options = Sequence[tuple[str, Any]]


class TlsSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYRE_TLS_", extra="ignore")

    ca_file: Path | None = None
    """PEM of the CA that signs every service's certificate (and every client's)."""
    cert_file: Path | None = None
    """PEM certificate chain this process presents, as a server and as a client."""
    key_file: Path | None = None
    """PEM private key of `cert_file`."""
    server_name: str = ""
    """Name a client expects in the server's certificate; empty: the host of the address."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsMaterial:
    ca: bytes
    cert: bytes
    key: bytes
    server_name: str = ""


def material() -> TlsMaterial | None:
    """This process's TLS files, read now; None when TLS is not configured."""
    settings = TlsSettings()
    files = {"ca_file": settings.ca_file, "cert_file": settings.cert_file, "key_file": settings.key_file}
    if all(path is None for path in files.values()):
        return None
    missing = [name for name, path in files.items() if path is None]
    if missing:
        raise InvalidArgument(
            f"GYRE_TLS_{missing[0].upper()}",
            "is unset while other GYRE_TLS_* files are set: mutual TLS needs a CA, a certificate and a key",
        )
    read: dict[str, bytes] = {}
    for name, path in files.items():
        assert path is not None
        try:
            read[name] = path.read_bytes()
        except OSError as exc:
            raise InvalidArgument(f"GYRE_TLS_{name.upper()}", f"cannot be read: {exc.strerror}") from exc
    return TlsMaterial(
        ca=read["ca_file"], cert=read["cert_file"], key=read["key_file"], server_name=settings.server_name
    )


def server_credentials(tls: TlsMaterial) -> grpc.ServerCredentials:
    """TLS that also requires the client's certificate, signed by our CA."""
    return grpc.ssl_server_credentials(
        [(tls.key, tls.cert)], root_certificates=tls.ca, require_client_auth=True
    )


def add_port(server: Any, address: str) -> int:
    """Bind `server` (grpc or grpc.aio) to `address`: mutual TLS when configured, else plaintext."""
    tls = material()
    if tls is None:
        return int(server.add_insecure_port(address))
    return int(server.add_secure_port(address, server_credentials(tls)))


def _channel_args(
    tls: TlsMaterial, options: Options | None
) -> tuple[grpc.ChannelCredentials, list[tuple[str, Any]]]:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
    )
    opts = list(options or [])
    if tls.server_name:
        opts.append(("grpc.ssl_target_name_override", tls.server_name))
    return credentials, opts


def aio_channel(
    address: str, *, options: Options | None = None, interceptors: Sequence[Any] | None = None
) -> grpc.aio.Channel:
    """A grpc.aio channel to another service: mutual TLS when configured, else plaintext."""
    tls = material()
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=cast(Any, interceptors))
    credentials, opts = _channel_args(tls, options)
    return grpc.aio.secure_channel(address, credentials, options=opts, interceptors=cast(Any, interceptors))


def sync_channel(address: str, *, options: Options | None = None) -> grpc.Channel:
    """A blocking channel to another service: mutual TLS when configured, else plaintext."""
    tls = material()
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    credentials, opts = _channel_args(tls, options)
    return grpc.secure_channel(address, credentials, options=opts)
