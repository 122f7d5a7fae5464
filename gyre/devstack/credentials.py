"""Credentials of the embedded servers: NATS user/password config, Postgres password file (shell).

Used when the local stack runs with `gyre up --secure`: NATS admits only one user, Postgres asks
every connection for a password (SCRAM), and the URLs the services get carry them.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

LOOPBACK = "127.0.0.1"


def nats_url(port: int, auth: tuple[str, str] | None) -> str:
    """Example: nats_url(4222, ("gyre", "s3cret")) -> "nats://gyre:s3cret@127.0.0.1:4222"."""
    credentials = "" if auth is None else f"{quote(auth[0], safe='')}:{quote(auth[1], safe='')}@"
    return f"nats://{credentials}{LOOPBACK}:{port}"


def nats_auth_config(data_dir: Path, auth: tuple[str, str]) -> Path:
    """A nats-server config (0600) that admits only `auth`'s user; strings written as JSON strings."""
    path = data_dir / "nats-auth.conf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"authorization {{\n  user: {json.dumps(auth[0])}\n  password: {json.dumps(auth[1])}\n}}\n")
    return path


@contextlib.contextmanager
def password_file(password: str, account: pwd.struct_passwd | None) -> Iterator[Path]:
    """The password in a file only the server's account reads (initdb --pwfile), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="gyre-pw-") as tmp:
        path = Path(tmp) / "pw"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        if account is not None:
            os.chown(tmp, account.pw_uid, account.pw_gid)
            os.chown(path, account.pw_uid, account.pw_gid)
        yield path


def trusts_anyone(data_dir: Path) -> bool:
    """Whether the cluster in `data_dir` lets any connection in without a password (pg_hba `trust`)."""
    try:
        lines = (data_dir / "pg_hba.conf").read_text().splitlines()
    except OSError:
        return False
    return any(
        line.split() and not line.lstrip().startswith("#") and line.split()[-1] == "trust" for line in lines
    )
