"""An execution in its task's own OCI image: the agent's container, its one way out, its diff (shell).

For `swebench` and `harbor` tasks the runner starts a container from the task's image instead of
a bubblewrap root (`gyre.sandbox.oci`): no network but the proxy forwarder (the same
`gyre.sandbox.forward` socket, relayed to 127.0.0.1:<listen_port> inside), the task's cpus,
memory and storage times the runner's multipliers. Before the harness starts, the repository is
cut back to its base (`git_scrub`; a folder that is no repository becomes one, so a Harbor
task's changes are a diff too), the built-in agent's files go to /opt/gyre-agent and the prompt
to /tmp/gyre/prompt.md. The harness runs in the image's workdir. When it ends (or at its
deadline, when every process but the container's first is killed) the runner exports the
agent's binary diff against the base and the harness log to a host folder, the workspace the
evaluator grades (`agent.diff`, `agent.log`), and the container is removed once graded.

The harness runs as AGENT_UID inside, never as the container's root (`gyre.sandbox.oci_policy`:
user namespace, capabilities, seccomp); the workdir and /tmp/gyre are handed to it, the agent's
code stays root's. A runner restarted while the harness runs re-attaches to the container
(`container_adopt`; the harness is the container's child, and its wrapper notes its pid and exit
status inside). Not built: harnesses other than those whose command runs in the image as it is
(the built-in agent needs the image's `python3` at 3.10 or newer).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gyre.errors import InvalidArgument
from gyre.sandbox.backend import ContainerLimits
from gyre.sandbox.forward import Forwarder
from gyre.sandbox.host import Forward, Outcome
from gyre.sandbox.keeper import read_tail
from gyre.sandbox.oci import Container, OciBackend
from gyre.sandbox.oci_policy import AGENT_UID
from services.runner.config import AGENT_FILES
from services.runner.git_scrub import scrub_future_history

CONTAINER_FAMILIES = ("swebench", "harbor")
"""Families whose tasks bring their own image (the evaluator's container_task, same names)."""
AGENT_DIFF, AGENT_LOG = "agent.diff", "agent.log"
"""What the evaluator reads from the workspace folder (its container_task, same names)."""
AGENT_HOME = "/opt/gyre-agent"
PROMPT_FILE = "/tmp/gyre/prompt.md"
GIT_LOG = "/tmp/gyre/git-commands.log"
MAX_DIFF_BYTES = 64 << 20
STORAGE_POLL_S = 1.0
ENSURE_REPO = (
    'mkdir -p "$1" && cd "$1" && { git rev-parse --git-dir >/dev/null 2>&1 || { git init -q && git add -A && '
    "git -c user.email=gyre@localhost -c user.name=gyre commit -q --allow-empty -m base; }; }"
)
EXPORT = 'cd "$1" && git add -A >/dev/null 2>&1; git diff --cached --binary "$2"'
AGENT_USER = f"{AGENT_UID}:{AGENT_UID}"
"""The harness's user inside (no capabilities, `no-new-privileges`; `gyre.sandbox.oci_policy`)."""
AGENT_TMP = "/tmp/gyre"
WRAP = (
    # The harness's pid and exit status inside, for a runner that re-attaches after a restart
    # (it is not that runner's child). The agent could rewrite them: they only tell a finished
    # run from a crashed one, both graded alike.
    'echo $$ > /tmp/gyre/harness.pid; "$@"; status=$?; echo $status > /tmp/gyre/harness.exit; exit $status'
)
POLL = (
    "cat /tmp/gyre/harness.exit 2>/dev/null && exit 0; pid=$(cat /tmp/gyre/harness.pid 2>/dev/null); "
    '[ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo running || echo gone'
)
REATTACH_POLL_S = 1.0
STATE_FILE = "container.json"
HAND_OVER = (
    # The workdir and the agent's own folder become the agent's; the agent's code stays root's.
    'chown -R "$2" "$1" && mkdir -p /tmp/gyre/home && touch /tmp/gyre/git-commands.log && '
    'chown -R "$2" /tmp/gyre && chmod -R a+rX /opt/gyre-agent'
)


R2E_TESTS = ("/root/r2e_tests", "/r2e_tests")
"""Where R2E-Gym images keep the tests that grade them; removed before the agent starts (the
grading container is fresh from the image and has them)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerSpec:
    image: str
    workdir: str
    base_commit: str
    limits: ContainerLimits
    hidden_paths: tuple[str, ...] = ()
    """Paths of the image the agent must not see (the dataset's own tests)."""


def read_spec(folder: Path) -> ContainerSpec:
    """What the runner needs of a container task's task.toml: image, workdir, base, limits."""
    path = folder / "task.toml"
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument("task", f"cannot read {path}: {exc}") from exc
    env, source = raw.get("environment", {}), raw.get("source", {})
    if not isinstance(env, dict) or not isinstance(env.get("image"), str) or not env["image"]:
        raise InvalidArgument(f"{path}.environment.image", "is required: the OCI image the task runs in")
    limits = ContainerLimits(
        cpus=float(env.get("cpus", 1.0)),
        memory_mb=int(env.get("memory_mb", 4096)),
        storage_mb=int(env.get("storage_mb", 10240)),
    )
    limits.validate(f"{path}.environment")
    source = source if isinstance(source, dict) else {}
    return ContainerSpec(
        image=env["image"],
        workdir=str(env.get("workdir", "/testbed")),
        base_commit=str(source.get("base_commit", "")),
        limits=limits,
        hidden_paths=R2E_TESTS if source.get("format") == "r2e" else (),
    )


class ContainerSandbox:
    """The runner's handle on one execution's container; shaped like `gyre.sandbox.host.Sandbox`
    where the supervisor uses it (`work`, `path`, `log_path`, `proc`, `kill`, `wait`, `release`)."""

    def __init__(self, root: Path, execution_id: str):
        self.path = root / f"c-{execution_id}"
        self.work = self.path / "work"
        self.log_path = self.path / "log" / "harness.log"
        self.name = f"gyre-run-{execution_id}"
        self.proc: asyncio.subprocess.Process | None = None
        self.box: Container | None = None
        self.forwarder: Forwarder | None = None
        self.spec: ContainerSpec | None = None
        self.base = ""
        self.killed = ""
        self.started_at = 0.0
        self.image_path = ""
        self.storage_peak_mb = 0.0
        """The most the agent had written over the set-up, as last measured."""
        """The image's own PATH, which the harness keeps (behind the git shim's folder)."""

    async def start(
        self, backend: OciBackend, spec: ContainerSpec, *, forward: Forward, max_connections: int, prompt: str
    ) -> None:
        self.spec = spec
        for folder in (self.work, self.log_path.parent):
            folder.mkdir(parents=True, exist_ok=True)
        self.forwarder = Forwarder(
            folder=self.path / "forward",
            host=forward.host,
            port=forward.port,
            max_connections=max_connections,
            uid=backend.host_uid(0),  # the relay: the container's root, an unprivileged host uid
        )
        await self.forwarder.start()
        self.box = await backend.create(
            name=self.name,
            image=spec.image,
            limits=spec.limits,
            forward_folder=str(self.forwarder.folder),
            listen_port=forward.listen_port,
            owner=owner_label(self.path.parent),
            workdir=spec.workdir,
            writable=(AGENT_HOME,),
            hidden=spec.hidden_paths,
        )
        made = await self.box.exec(["sh", "-c", ENSURE_REPO, "repo", spec.workdir], timeout_s=120)
        if made.exit_code != 0:
            raise OSError(
                f"{spec.workdir} is not a git repository and none could be made: {made.output[-300:]!r}"
            )
        await scrub_future_history(self.box, workdir=spec.workdir, base_commit=spec.base_commit)
        if spec.hidden_paths and self.box.disk is None:  # else covered by empty tmpfs (`create`)
            hidden = await self.box.exec(["rm", "-rf", "--", *spec.hidden_paths], timeout_s=60)
            if hidden.exit_code != 0:
                raise OSError(f"the dataset's tests could not be hidden: {hidden.output[-300:]!r}")
        head = await self.box.exec(["git", "rev-parse", "HEAD"], timeout_s=30, workdir=spec.workdir)
        self.base = head.output.decode().strip()
        with tempfile.TemporaryDirectory(prefix="gyre-agent-") as tmp:
            staged = Path(tmp) / "gyre-agent"
            checkout = Path(AGENT_FILES[0]).parent.parent  # services/__init__.py -> the checkout
            for source in map(Path, AGENT_FILES):
                dest = staged / source.relative_to(checkout)
                if source.is_dir():
                    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(source, dest)
            await self.box.upload(str(staged), AGENT_HOME)
        await self.box.write_file(PROMPT_FILE, prompt.encode())
        # A reviewer's signal, not a wall: git commands the harness runs through PATH are noted
        # (the agent can bypass it; the future it would look for is gone anyway).
        found = await self.box.exec(["sh", "-c", 'command -v git; echo "$PATH"'], timeout_s=30)
        real_git, _, self.image_path = found.output.decode().strip().partition("\n")
        shim = f'#!/bin/sh\necho "git $*" >> {GIT_LOG}\nexec {real_git or "/usr/bin/git"} "$@"\n'
        await self.box.write_file(f"{AGENT_HOME}/bin/git", shim.encode(), mode="755")
        handed = await self.box.exec(
            ["sh", "-c", HAND_OVER, "hand-over", spec.workdir, AGENT_USER], timeout_s=300
        )
        if handed.exit_code != 0:
            raise OSError(f"the workdir could not be handed to the agent's user: {handed.output[-300:]!r}")
        await self.box.mark_storage_base()
        await asyncio.to_thread((self.path / STATE_FILE).write_text, json.dumps(self.state()))

    def state(self) -> dict[str, object]:
        """What a restarted runner needs to re-attach (`container_adopt`), kept in STATE_FILE."""
        assert self.box is not None and self.spec is not None
        return {
            "image": self.spec.image,
            "workdir": self.spec.workdir,
            "base": self.base,
            "limits": dataclasses.asdict(self.spec.limits),
            "staged": self.box.staged,
            "image_path": self.image_path,
            "storage_base_mb": self.box.storage_base_mb,
            "disk": self.box.disk is not None,
        }

    def base_url(self, forward: Forward) -> str:
        """The proxy as the harness inside sees it: the relay on the container's loopback."""
        return f"http://127.0.0.1:{forward.listen_port}"

    async def launch(
        self, argv: Sequence[str], *, env: Mapping[str, str], forward: Forward | None = None
    ) -> None:
        """Start the harness in the workdir (the forwarder already runs: `forward` is unused)."""
        assert self.box is not None and self.spec is not None
        # The image's own PATH (a conda env, say) stays: the runner's host PATH means nothing here.
        env = {k: v for k, v in env.items() if k != "PATH"} | {
            "PYTHONPATH": AGENT_HOME,
            "PATH": f"{AGENT_HOME}/bin:{self.image_path or '/usr/local/bin:/usr/bin:/bin'}",
            "HOME": f"{AGENT_TMP}/home",
        }
        # Through a file only root reads, never the command line: the token is in it.
        env_file = self.path / "harness.env"
        env_file.touch(mode=0o600)
        env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        log = self.log_path.open("ab")
        try:
            self.proc = await self.box.spawn(
                ["sh", "-c", WRAP, "harness", *argv],
                workdir=self.spec.workdir,
                env_file=env_file,
                output=log,
                user=AGENT_USER,
            )
        finally:
            log.close()
        self.started_at = time.monotonic()

    async def wait(self, *, timeout_s: float) -> Outcome:
        """The harness's end (or its deadline), then the diff exported; the container stays."""
        watch = asyncio.create_task(self._watch_storage())
        # A harness this process started is its child; one a previous runner started (re-attached)
        # is followed through the files its wrapper writes inside.
        ended = self.proc.wait() if self.proc is not None else self._poll_harness()
        try:
            code: int | None = await asyncio.wait_for(ended, timeout=max(0.1, timeout_s))
        except TimeoutError:
            await self.kill("deadline")
            code = None
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        if self.killed:
            if self.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
            code = None
        duration = time.monotonic() - self.started_at
        (self.path / "harness.env").unlink(missing_ok=True)
        await self.export()
        # The harness command was started (`launch` returned), so what follows is its outcome.
        return Outcome(exit_code=code, killed=self.killed, duration_s=duration, started=True)

    async def _poll_harness(self) -> int | None:
        """Wait for a re-attached harness: its exit status once its wrapper wrote one, None when
        its process is gone without one (killed inside, or the container restarted)."""
        assert self.box is not None
        while True:
            done = await self.box.exec(["sh", "-c", POLL], timeout_s=30)
            text = done.output.decode(errors="replace").strip()
            if text != "running":
                return int(text) if text.lstrip("-").isdigit() else None
            await asyncio.sleep(REATTACH_POLL_S)

    async def _watch_storage(self) -> None:
        """The disk quota's second line: what the agent wrote is measured every STORAGE_POLL_S and
        the harness killed (`disk_quota`, the agent's own doing) once it is past its task's
        storage_mb. The first is the workdir's own disk (`gyre.sandbox.oci_disk`), full at that
        size; without one (Docker, not root) this is the only line, and what is written within
        one poll reaches the host's disk."""
        assert self.box is not None and self.spec is not None
        while True:
            await asyncio.sleep(STORAGE_POLL_S)
            used = await self.box.storage_used_mb() - self.box.storage_base_mb
            self.storage_peak_mb = max(self.storage_peak_mb, used)
            if used > self.spec.limits.storage_mb:
                await self.kill("disk_quota")
                return

    async def log_tail(self, limit: int = 2000, *, name: str = "harness.log") -> str:
        """The last `limit` bytes of the harness's log (the only log a container execution has)."""
        return await asyncio.to_thread(read_tail, self.log_path.parent / name, limit)

    async def kill(self, reason: str) -> None:
        """Every process of the agent's user ends (the relay, root's, stays); the files stay for
        the diff. When no command can start inside (a fork bomb holds the pids limit) the whole
        container is stopped and started again instead."""
        self.killed = self.killed or reason
        if self.box is not None:
            done = await self.box.exec(["sh", "-c", "kill -9 -1"], timeout_s=30, user=AGENT_USER)
            if done.exit_code not in (0, 1):  # 1: nothing left to kill
                await self.box.restart()

    async def export(self) -> None:
        assert self.box is not None and self.spec is not None
        # As the agent's user: git reads the repository's config and hooks, which the agent
        # could have written (core.fsmonitor runs a command), so root never runs git there.
        done = await self.box.exec(
            ["sh", "-c", EXPORT, "export", self.spec.workdir, self.base],
            timeout_s=300,
            max_output=MAX_DIFF_BYTES,
            user=AGENT_USER,
        )
        await asyncio.to_thread(
            (self.work / AGENT_DIFF).write_bytes, done.output if done.exit_code == 0 else b""
        )
        commands = await self.box.download(GIT_LOG, max_bytes=1 << 20) or b""
        harness = self.log_path.read_bytes()[-(4 << 20) :] if self.log_path.exists() else b""
        await asyncio.to_thread((self.work / AGENT_LOG).write_bytes, harness + b"\n" + commands)

    async def release(self) -> None:
        if self.box is not None:
            await self.box.close()
        if self.forwarder is not None:
            await self.forwarder.close()
        await asyncio.to_thread(shutil.rmtree, self.path, True)


def owner_label(sandbox_root: Path) -> str:
    """The label of this runner's containers: its sandbox folder, so a restarted runner sweeps its
    own leftovers and never another runner's on the same host."""
    return f"runner:{sandbox_root.resolve()}"


def task_folder(ref: str, tasks_dir: Path) -> Path:
    return Path(ref) if ("/" in ref or ref.startswith(".")) else tasks_dir / ref
