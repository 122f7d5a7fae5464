"""Sandboxes from OCI images on the local container engine (shell: the podman or docker CLI).

Rootful Podman with the `runc` runtime (this kernel's hybrid cgroups refuse `crun`), or Docker
when its daemon answers. A container starts with no network at all (`--network none`), its
task's cpus, memory and process limits, lowered open-file limits, no added capabilities and
`no-new-privileges`. With a forward folder, its first process is `gyre.sandbox.init`'s Relay
(the image's own `python3`): 127.0.0.1:<listen_port> inside reaches the host's forwarder socket
in that folder, the one way out, exactly as in the bubblewrap root. Without one it sleeps and
commands run beside it with `exec`.

Storage: the engines here cannot cap a writable layer on overlay over ext4. A container created
with a `workdir` on Podman as root therefore gets a hard limit (`gyre.sandbox.oci_disk`): a
read-only root, the workdir on a loop-mounted ext4 of `storage_mb` over what the image's workdir
holds, and sized tmpfs for every other writable path (TMPFS_PATHS, /dev/shm, the caller's
`writable` ones). Elsewhere (Docker, not root, no workdir) the root stays writable. Either way
`exec` measures what was written after each command (`storage_exceeded`), the second line, and
the caller scores an over-quota workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import structlog

from gyre.errors import InvalidArgument, Unavailable
from gyre.sandbox.backend import ContainerLimits, ExecResult
from gyre.sandbox.oci_disk import WorkDisk, disk_unsupported, sweep_disks, tree_mb
from gyre.sandbox.oci_policy import DEFAULT_SECCOMP, engine_security_args, host_uid, seccomp_profile

log = structlog.get_logger(__name__)
GYRE_DIR = "/run/gyre"
"""Where the relay's code appears inside (read-only)."""
FORWARD_DIR = "/run/gyre-forward"
"""Where the forwarder's socket folder appears inside (read-only; apart from GYRE_DIR, since a
mount point cannot be made inside a read-only mount)."""
INIT = Path(__file__).resolve().parent / "init.py"
CLI_TIMEOUT_S = 120.0
TMPFS_PATHS = ("/tmp", "/var/tmp")
"""Writable in every read-only container, in its memory (each at most `storage_mb`)."""
RELAY = (
    "import selectors, sys\n"
    "sys.path.insert(0, '/run/gyre')\n"
    "from init import Relay\n"
    "relay = Relay(listen_port=int(sys.argv[1]), socket_path='/run/gyre-forward/proxy.sock')\n"
    "sel = selectors.DefaultSelector()\n"
    "relay.register(sel)\n"
    "while True:\n"
    "    for key, _ in sel.select():\n"
    "        key.data(sel, key.fileobj)\n"
)


def find_engine() -> list[str] | None:
    """The engine's command prefix: podman (with runc) first, docker when its daemon answers."""
    podman = shutil.which("podman")
    if podman:
        return [podman, "--runtime", "runc"] if shutil.which("runc") else [podman]
    docker = shutil.which("docker")
    if docker and os.path.exists("/var/run/docker.sock"):
        return [docker]
    return None


async def _run(
    argv: Sequence[str], *, stdin: bytes | None = None, timeout_s: float = CLI_TIMEOUT_S
) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin), timeout=timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise Unavailable(
            f"container engine did not answer within {timeout_s:g} s: {' '.join(argv[:4])}"
        ) from None
    return proc.returncode or 0, out, err


class OciBackend:
    """Containers of one local engine; `engine` is the command prefix (`find_engine()`)."""

    def __init__(self, engine: Sequence[str] | None = None):
        found = list(engine) if engine is not None else find_engine()
        if not found:
            raise Unavailable("no container engine: install podman and runc (or run a docker daemon)")
        self.engine = found
        self.podman = os.path.basename(found[0]).startswith("podman")
        self._seccomp = ""
        why = disk_unsupported() if self.podman else "Docker: no `podman mount` of a created container"
        self.hard_disk = not why
        if why:
            log.warning("container_disk_not_enforced", why=why, fallback="the writable layer is measured")

    def seccomp_file(self) -> str:
        """The container profile (`oci_policy.seccomp_profile`) written once per process; empty
        where the engine's default profile is not on disk (Docker's own default then applies)."""
        if self._seccomp and os.path.exists(self._seccomp):
            return self._seccomp
        try:
            default = json.loads(Path(DEFAULT_SECCOMP).read_text())
        except (OSError, ValueError):
            log.warning("container_seccomp_default_missing", path=DEFAULT_SECCOMP)
            return ""
        fd, path = tempfile.mkstemp(prefix="gyre-seccomp-", suffix=".json")
        with os.fdopen(fd, "w") as out:
            json.dump(seccomp_profile(default), out)
        self._seccomp = path
        return path

    def host_uid(self, inside: int) -> int:
        """The host uid of a uid inside this engine's containers (the user namespace's map)."""
        return host_uid(inside, podman=self.podman)

    async def image_present(self, image: str) -> bool:
        code, _, _ = await _run([*self.engine, "image", "inspect", "--format", "{{.Id}}", image])
        return code == 0

    async def require_image(self, image: str, *, at: str = "environment.image") -> None:
        """InvalidArgument naming the field when the image is not in the local store."""
        if not image:
            raise InvalidArgument(at, "is required: the OCI image the task runs in")
        if not await self.image_present(image):
            raise InvalidArgument(at, f"image {image!r} is not present in the local container store")

    async def create(
        self,
        *,
        name: str,
        image: str,
        limits: ContainerLimits,
        forward_folder: str = "",
        listen_port: int = 18080,
        owner: str = "",
        workdir: str = "",
        writable: Sequence[str] = (),
        hidden: Sequence[str] = (),
    ) -> Container:
        """`owner` labels the container (`gyre.owner`) so its owner can sweep what a crash left.
        With a `workdir` (and `hard_disk`) the root is read-only, the workdir a disk of its own,
        `writable` paths empty tmpfs, `hidden` paths covered by an empty read-only tmpfs."""
        limits.validate()
        hard = bool(workdir) and self.hard_disk
        argv = [
            *self.engine,
            "create" if hard else "run",
            *([] if hard else ["-d"]),
            "--name",
            name,
            "--network",
            "none",
            # A real init as pid 1 (the engine's catatonit or tini): it reaps orphans, so a fork
            # bomb's zombies do not hold the pids limit after the harness is killed.
            "--init",
            # Not the image's WorkingDir: where the image has none in a layer (a Dockerfile's bare
            # `WORKDIR /app`), Podman 4.3 makes it at start outside the uid map (owned by nobody,
            # unwritable even by the container's root). Commands name their folder; set-up makes it.
            "--workdir",
            "/",
            *engine_security_args(podman=self.podman, seccomp_file=self.seccomp_file()),
            "--cpus",
            f"{limits.cpus:g}",
            "--memory",
            f"{limits.memory_mb}m",
            "--memory-swap",
            f"{limits.memory_mb}m",
            "--pids-limit",
            str(limits.max_procs),
            "--ulimit",
            f"nofile={limits.open_files}:{limits.open_files}",
            "--ulimit",
            f"nproc={limits.max_procs}:{limits.max_procs}",
            "--label",
            "gyre.sandbox=1",
            "--label",
            f"gyre.owner={owner}",
        ]
        if hard:
            size = f"size={limits.storage_mb}m"
            argv += ["--read-only", "--read-only-tmpfs=false", "--shm-size", f"{limits.storage_mb}m"]
            for path in TMPFS_PATHS:
                argv += ["--tmpfs", f"{path}:rw,nosuid,nodev,mode=1777,{size}"]
            for path in writable:
                argv += ["--tmpfs", f"{path}:rw,nosuid,nodev,mode=755,{size}"]
            for path in hidden:
                argv += ["--tmpfs", f"{path}:ro,nosuid,nodev,noexec,mode=0,size=4k"]
            # The mount point must exist for `create`; the disk is mounted on it before `start`.
            mount = WorkDisk(name).mount
            await asyncio.to_thread(mount.mkdir, mode=0o700, parents=True, exist_ok=True)
            argv += ["-v", f"{mount}:{workdir}"]
        staged = ""
        if forward_folder:
            # The relay's code and the forwarder's socket, read-only: the container can connect
            # to the socket but cannot replace either.
            staged = tempfile.mkdtemp(prefix="gyre-oci-")
            shutil.copy(INIT, Path(staged) / "init.py")
            # The relay runs as the container's root, an unprivileged host uid: it must read these.
            os.chmod(staged, 0o755)
            os.chmod(Path(staged) / "init.py", 0o644)
            argv += ["-v", f"{staged}:{GYRE_DIR}:ro", "-v", f"{forward_folder}:{FORWARD_DIR}:ro"]
            argv += ["--entrypoint", "python3", image, "-I", "-S", "-c", RELAY, str(listen_port)]
        else:
            argv += ["--entrypoint", "sleep", image, "infinity"]
        code, _, err = await _run(argv)
        disk: WorkDisk | None = None
        try:
            if code == 0 and hard:
                disk = await self._attach_disk(name, workdir, limits, owner=owner)
                code, _, err = await _run([*self.engine, "start", name])
        except BaseException:
            code, err = 1, b"the workdir disk could not be made"
            raise
        finally:
            if code != 0:
                if staged:
                    shutil.rmtree(staged, ignore_errors=True)
                await _run([*self.engine, "rm", "-f", name])
                if hard:
                    await (disk or WorkDisk(name)).remove()
        if code != 0:
            raise Unavailable(
                f"container {name} from {image!r} did not start: {err.decode(errors='replace')[-800:]}"
            )
        box = Container(name=name, engine=self.engine, limits=limits, staged=staged, disk=disk)
        if disk is not None:
            box.storage_base_mb = disk.used_mb()
        elif workdir:  # not made by the engine (`--workdir /` above); a no-op where the image has it
            made = await box.exec(["mkdir", "-p", workdir], timeout_s=CLI_TIMEOUT_S)
            if made.exit_code != 0:
                await box.close()
                raise Unavailable(f"container {name}: its workdir {workdir} could not be made")
        return box

    async def _attach_disk(self, name: str, workdir: str, limits: ContainerLimits, *, owner: str) -> WorkDisk:
        """The created container's workdir volume: sized to the image's workdir plus the quota,
        filled from the container's own root (mounted, so owners are already its host uids)."""
        code, out, err = await _run([*self.engine, "mount", name])
        if code != 0:
            raise Unavailable(f"container {name} could not be mounted: {err.decode(errors='replace')[-300:]}")
        try:
            source = Path(out.decode().strip()) / workdir.lstrip("/")
            base_mb = await asyncio.to_thread(tree_mb, source)
            size_mb = int(base_mb * 1.1) + limits.storage_mb + 4
            disk = await WorkDisk.make(name, size_mb, owner=owner)
            try:
                # No workdir in the image (a bare `WORKDIR`): an empty one, the container root's.
                await disk.fill_from(source, owner_uid=self.host_uid(0))
            except BaseException:
                await disk.remove()
                raise
            return disk
        finally:
            await _run([*self.engine, "umount", name])

    async def sweep(self, owner: str, *, keep: frozenset[str] = frozenset()) -> int:
        """Remove every container labelled with `owner` (what a killed process left) but those
        named in `keep` (a restarted runner's re-attached ones); how many."""
        code, out, _ = await _run(
            [*self.engine, "ps", "-a", "--filter", f"label=gyre.owner={owner}", "--format", "{{.Names}}"]
        )
        names = [n for n in out.decode().split() if n not in keep] if code == 0 else []
        if names:
            await _run([*self.engine, "rm", "-f", "-t", "0", *names])
        # Disks go after their containers (a mounted one is busy); also those whose container
        # was already gone when the owner died.
        await sweep_disks(owner, keep=keep)
        return len(names)


class Container:
    """One running container; every method is safe to call after `close` (it does nothing)."""

    def __init__(
        self,
        *,
        name: str,
        engine: list[str],
        limits: ContainerLimits,
        staged: str = "",
        disk: WorkDisk | None = None,
    ):
        self.name = name
        self.disk = disk
        """The workdir's own volume (hard limit), or None: the writable layer is measured."""
        self.engine = engine
        self.limits = limits
        self.staged = staged
        self.closed = False
        self.storage_base_mb = 0.0
        """What the set-up wrote (`mark_storage_base`): not the agent's, so not its quota."""

    async def mark_storage_base(self) -> None:
        """From now on only what is written past the current writable layer counts against
        `storage_mb` (handing the workdir to the agent's uid copies its files up)."""
        self.storage_base_mb = await self.storage_used_mb()

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        workdir: str = "",
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        max_output: int = 8 << 20,
        user: str = "",
    ) -> ExecResult:
        """Run a command (as the container's root, or `user` as "uid:gid"); past `timeout_s` the
        whole container is stopped (nothing outlives its deadline) and the result says `timed_out`."""
        cmd = [*self.engine, "exec", *(["-i"] if stdin is not None else [])]
        if workdir:
            cmd += ["-w", workdir]
        if user:
            cmd += ["--user", user]
        for key, value in (env or {}).items():
            cmd += ["-e", f"{key}={value}"]
        cmd += [self.name, *argv]
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        chunks: list[bytes] = []
        size = 0

        async def drain() -> None:
            nonlocal size
            assert proc.stdout is not None
            if stdin is not None:
                assert proc.stdin is not None
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    proc.stdin.write(stdin)
                    await proc.stdin.drain()
                proc.stdin.close()
            while data := await proc.stdout.read(65536):
                if size < max_output:
                    chunks.append(data[: max_output - size])
                size += len(data)
            await proc.wait()

        timed_out = False
        try:
            await asyncio.wait_for(drain(), timeout=max(0.1, timeout_s))
        except TimeoutError:
            timed_out = True
            await _run([*self.engine, "kill", self.name])
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        over = (
            await self.storage_used_mb() - self.storage_base_mb > self.limits.storage_mb
            if not timed_out
            else False
        )
        return ExecResult(
            exit_code=None if timed_out else proc.returncode,
            output=b"".join(chunks),
            timed_out=timed_out,
            truncated=size > max_output,
            storage_exceeded=over,
        )

    async def spawn(
        self, argv: Sequence[str], *, workdir: str, env_file: Path, output: BinaryIO, user: str = ""
    ) -> asyncio.subprocess.Process:
        """Start a long command (a harness) inside, its output into `output`; the caller waits.
        The environment comes from a file, so no secret of it shows on the host's command lines."""
        cmd = [*self.engine, "exec", "-w", workdir, "--env-file", str(env_file)]
        cmd += [*(["--user", user] if user else []), self.name, *argv]
        return await asyncio.create_subprocess_exec(
            *cmd, stdin=asyncio.subprocess.DEVNULL, stdout=output, stderr=asyncio.subprocess.STDOUT
        )

    async def restart(self) -> None:
        """Stop every process and start the container's first command again; the files stay.
        For when no command can be started inside any more (its pids limit held by a fork bomb)."""
        await _run([*self.engine, "kill", self.name])
        code, _, err = await _run([*self.engine, "start", self.name])
        if code != 0:
            raise Unavailable(
                f"container {self.name} did not start again: {err.decode(errors='replace')[-400:]}"
            )

    async def storage_used_mb(self) -> float:
        """What the workdir's disk holds (the rest is read-only or memory), else the writable layer."""
        if self.disk is not None:
            return self.disk.used_mb()
        code, out, _ = await _run(
            [*self.engine, "container", "inspect", "--size", "--format", "{{.SizeRw}}", self.name]
        )
        if code != 0:
            return 0.0
        try:
            return int(out.strip() or 0) / (1 << 20)
        except ValueError:
            return 0.0

    async def upload(self, source: str, dest: str) -> None:
        """A host file to `dest`, or a folder's contents into `dest` (a trailing "/." alike), as
        root: a tar stream into `tar -x` inside, since `podman cp` cannot write into a tmpfs of a
        container with a user namespace (nor into a read-only root)."""
        data, folder = await asyncio.to_thread(_tar, Path(source), dest)
        script = f"mkdir -p {_q(folder)} && tar -x -f - -C {_q(folder)}"
        done = await self.exec(["sh", "-c", script], timeout_s=CLI_TIMEOUT_S, stdin=data)
        if done.exit_code != 0:
            why = done.output.decode(errors="replace")[-400:]
            raise Unavailable(f"upload of {source} to {self.name}:{dest} failed: {why}")

    async def write_file(self, dest: str, data: bytes, *, mode: str = "644") -> None:
        """Write bytes to `dest` inside (its folder created), as root."""
        folder = os.path.dirname(dest) or "/"
        script = f"mkdir -p {_q(folder)} && cat > {_q(dest)} && chmod {mode} {_q(dest)}"
        result = await self.exec(["sh", "-c", script], timeout_s=CLI_TIMEOUT_S, stdin=data)
        if result.exit_code != 0:
            raise Unavailable(
                f"writing {dest} in {self.name} failed: {result.output.decode(errors='replace')[-400:]}"
            )

    async def download(self, path: str, *, max_bytes: int = 64 << 20) -> bytes | None:
        script = f"test -f {_q(path)} || exit 3; head -c {max_bytes} {_q(path)}"
        result = await self.exec(["sh", "-c", script], timeout_s=CLI_TIMEOUT_S, max_output=max_bytes)
        if result.exit_code == 3:
            return None
        if result.exit_code != 0:
            raise Unavailable(
                f"download of {path} from {self.name} failed: {result.output.decode(errors='replace')[-400:]}"
            )
        return result.output

    async def alive(self) -> bool:
        if self.closed:
            return False
        code, out, _ = await _run(
            [*self.engine, "container", "inspect", "--format", "{{json .State.Running}}", self.name]
        )
        return code == 0 and json.loads(out.strip() or b"false") is True

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        code, _, err = await _run([*self.engine, "rm", "-f", "-t", "0", self.name])
        if code != 0:  # Podman 4.3 can race its own clean-up of the shm mount ("busy"): once more
            await asyncio.sleep(1.0)
            code, _, err = await _run([*self.engine, "rm", "-f", "-t", "0", "--ignore", self.name])
        if code != 0:
            log.warning(
                "container_remove_failed", container=self.name, error=err.decode(errors="replace")[-300:]
            )
        if self.staged:
            shutil.rmtree(self.staged, ignore_errors=True)
        if self.disk is not None and code == 0:
            await self.disk.remove()


def _tar(src: Path, dest: str) -> tuple[bytes, str]:
    """A tar of a file (named as `dest`) or of a folder's contents, and where to unpack it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if src.is_dir():
            for child in sorted(src.iterdir()):
                tar.add(child, arcname=child.name, filter=_root_owned)
            return buffer.getvalue(), dest
        tar.add(src, arcname=os.path.basename(dest), filter=_root_owned)
    return buffer.getvalue(), os.path.dirname(dest) or "/"


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _q(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
