"""Runner settings, env prefix GYRE_RUNNER_ (shell)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from gyre.sandbox.limits import SandboxLimits
from services.runner.workspace import TemplateSources

BUNDLED_TASKS = Path(__file__).resolve().parents[1] / "evaluator" / "tasks"
_SERVICES = Path(__file__).resolve().parents[1]
AGENT_FILES = (
    str(_SERVICES / "__init__.py"),
    str(_SERVICES / "runner" / "__init__.py"),
    str(_SERVICES / "runner" / "agent"),
)
"""The built-in agent's own files: all a sandbox sees of the checkout (no hidden tests, no .git)."""


class RunnerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYRE_RUNNER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 0
    """gRPC port; 0 picks a free one."""
    sandbox_root: Path = Path(".gyre/runner/sandboxes")
    """Where sandboxes (and so the preserved workspaces) live; not under /tmp."""
    sandbox_mode: str = "auto"
    """`auto` (best the kernel allows, fallbacks logged), `strict` (refuse less), `rlimits` (fallback)."""
    uid_base: int = 62000
    """First uid handed to sandbox users (one per sandbox, up to 1000)."""
    proxy_address: str = ""
    """The proxy's gRPC address for RegisterExecutionToken; empty: tokens are not registered."""
    scheduler_address: str = ""
    """The scheduler's gRPC address: the runner registers what it can run there every 30 s, and
    the scheduler refuses at submission what it could not (empty: no registration)."""
    proxy_base_url: str = "http://127.0.0.1:8080"
    """The proxy's HTTP root (OpenAI at /v1, Anthropic at /v1/messages): the one place a sandbox may reach."""
    tasks_dir: Path = BUNDLED_TASKS
    """Where `task:<name>` templates are looked up."""
    task_sets: dict[str, Path] = {}
    """Registered task sets (JSON object, name -> folder of task folders): `taskset:<set>/<task>`
    templates copy `<folder>/<task>/workspace`. No other host folder can become a workspace."""
    template_urls: list[str] = []
    """URL prefixes git templates may come from (e.g. `https://github.com/org/`); empty: none."""
    sandbox_runtime: list[str] = []
    """More read-only paths every harness sandbox sees at the same place (a harness installed
    outside /usr, e.g. the folder of Claude Code's `claude`); they lead the harness's PATH. The
    Python installation and the built-in agent are always there."""
    agent_model: str = "gyre-policy"
    harness_env: dict[str, str] = {}
    """Variables every harness gets (JSON object), e.g. the built-in agent's budget
    `{"GYRE_AGENT_MAX_TOKENS": "96"}` or Claude Code's tool set `{"GYRE_CLAUDE_CODE_TOOLS":
    "Bash,Read,Edit,Write,Agent"}` (harness.py); an execution's own `harness_env` wins over these."""
    """Model name the harnesses ask for (the proxy routes it to the policy)."""
    max_running: int = 8
    container_cpus: float = 1.0
    """Multiplier on a container task's own `environment.cpus` (memory and storage below)."""
    container_memory: float = 1.0
    container_storage: float = 1.0
    keep_workspace_s: float = 6 * 3600.0
    """How long an ended execution's sandbox (its workspace) is kept at most when no grade comes:
    it is released as soon as its RewardAssigned arrives (a grader killed mid-grading is
    redelivered and still finds it); a stopping runner leaves them all, running or ended, and a
    restarted runner keeps the ones still waiting (`gyre down` sweeps what a stopped stack left)."""
    token_grace_s: float = 600.0
    """How long after the deadline a token still works (calls in flight)."""
    revoke_retry_s: float = 300.0
    """How long an execution's end waits for the proxy to revoke its token and count its calls;
    past it the end event goes out without the count (the group then waits for no calls)."""
    start_wait_s: float = 60.0
    """How long StartExecution waits for the harness process before answering `starting`."""
    cpu_s: int = 3600
    memory_mb: int = 2048
    """Memory of the sandbox (cgroup) and address space per process."""
    address_space_mb: int = 0
    """Address space per process when it must differ from memory_mb (0: the same); a harness
    whose runtime needs more (Claude Code) raises it for its own sandboxes (`harness.REGISTRY`)."""
    max_procs: int = 256
    file_size_mb: int = 512
    disk_mb: int = 1024
    cpus: float = 2.0
    max_connections: int = 64
    """Connections a harness may hold open at once through the forwarded proxy port."""

    def container_multipliers(self) -> dict[str, float]:
        """Keyword arguments of `ContainerLimits.scaled` from these settings."""
        return {
            "cpus": self.container_cpus,
            "memory": self.container_memory,
            "storage": self.container_storage,
        }

    def limits(self) -> SandboxLimits:
        return SandboxLimits.of(self)

    def template_sources(self) -> TemplateSources:
        return TemplateSources(
            tasks_dir=self.tasks_dir, task_sets=dict(self.task_sets), template_urls=tuple(self.template_urls)
        )
