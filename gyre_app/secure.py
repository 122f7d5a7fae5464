"""`gyre up --secure`: a CA, per-process certificates and server passwords in the state folder (shell).

Everything lives in `<state>/secure/` (0700, files 0600) and is made once, then reused, so a
restarted service or server keeps working with what the others hold:
- `ca.pem` / `ca.key`: a CA made for this stack only;
- `<name>.pem` / `<name>.key`: one certificate per process (each service, engine and cell agent,
  and `client` for the `gyre` command), valid for 127.0.0.1 and localhost, for both server and
  client authentication (every service is also a client of others);
- `nats.password`, `postgres.password`: the embedded servers' credentials (NATS user `gyre`,
  Postgres user `postgres`).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NATS_USER = "gyre"
CLIENT = "client"
VALID_DAYS = 365


@dataclass(frozen=True, slots=True, kw_only=True)
class SecureStack:
    folder: Path
    nats_user: str
    nats_password: str
    postgres_password: str

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    def cert_file(self, name: str) -> Path:
        return self.folder / f"{name}.pem"

    def key_file(self, name: str) -> Path:
        return self.folder / f"{name}.key"

    def client_files(self) -> dict[str, str]:
        """What the state file records for the `gyre` command (see gyre.tls)."""
        return {
            "ca_file": str(self.ca_file),
            "cert_file": str(self.cert_file(CLIENT)),
            "key_file": str(self.key_file(CLIENT)),
        }


def use_tls_env(tls_env: dict[str, str]) -> None:
    """Present a certificate on this process's channels (and its children's) unless GYRE_TLS_*
    already say otherwise: the `gyre` command and `gyre up` as clients of a secure stack."""
    if tls_env and not any(key.startswith("GYRE_TLS_") for key in os.environ):
        os.environ.update(tls_env)


def process_tls_env(state_dir: Path, name: str) -> dict[str, str]:
    """The GYRE_TLS_* settings of process `name` of the secure stack in `state_dir` (made by `prepare`)."""
    folder = state_dir / "secure"
    return {
        "GYRE_TLS_CA_FILE": str(folder / "ca.pem"),
        "GYRE_TLS_CERT_FILE": str(folder / f"{name}.pem"),
        "GYRE_TLS_KEY_FILE": str(folder / f"{name}.key"),
    }


def prepare(state_dir: Path, names: list[str]) -> SecureStack:
    """Make (or reuse) the CA, a certificate for each of `names` and `client`, and the passwords."""
    return make_keys(state_dir / "secure", names)


def make_keys(folder: Path, names: list[str], *, hosts: tuple[str, ...] = ()) -> SecureStack:
    """The CA, certificates and passwords in `folder` (what `gyre certs` writes for deploy/): each
    certificate names its process, `gyre-<name>`, localhost, 127.0.0.1 and `hosts` (a wildcard
    such as `*.gyre-cell` covers a StatefulSet's pods)."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    ca_key, ca_cert = _ca(folder)
    for name in [*names, CLIENT]:
        if not (folder / f"{name}.pem").exists():
            _issue(folder, name, ca_key, ca_cert, hosts)
    return SecureStack(
        folder=folder,
        nats_user=NATS_USER,
        nats_password=_password(folder / "nats.password"),
        postgres_password=_password(folder / "postgres.password"),
    )


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _password(path: Path) -> str:
    if not path.exists():
        _write_private(path, secrets.token_urlsafe(24).encode())
    return path.read_text().strip()


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _ca(folder: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key_path, cert_path = folder / "ca.key", folder / "ca.pem"
    if key_path.exists() and cert_path.exists():
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return key, x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gyre local CA {secrets.token_hex(4)}")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write_private(key_path, _key_pem(key))
    _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def _issue(
    folder: Path,
    name: str,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    extra: tuple[str, ...],
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    hosts = list(dict.fromkeys(["localhost", name, f"gyre-{name}", *extra]))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gyre-{name}")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .add_extension(
            x509.SubjectAlternativeName(
                [*(x509.DNSName(h) for h in hosts), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(folder / f"{name}.key", _key_pem(key))
    _write_private(folder / f"{name}.pem", cert.public_bytes(serialization.Encoding.PEM))
