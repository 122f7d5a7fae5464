"""What the registered runners can run, and the tasks none of them could (pure).

Each runner registers what it can run (`RegisterRunner`): its harnesses, whether each one's
program is on its sandboxes' PATH, the harness_env each harness reads, its task sets and the git
URL prefixes it fetches from. `check_offered` refuses at submission a task that no registered
runner could start, naming the field, so that it never becomes an infrastructure failure (which
burns the group's retries) or a policy's score later. With no runner registered yet, nothing is
checked here: the scheduler's own catalog (`runnable.py`) still is.

Example:
    offers: runner r1 has claude-code without `claude` on its PATH, git prefix https://github.com/org/
    TaskSpec(harness="claude-code", ...) -> tasks[0].harness: no registered runner can start ...
    TaskSpec(harness="gyre-agent", workspace_template="https://evil.example/x.git")
        -> tasks[0].workspace_template: 'https://evil.example/x.git' is under none of ...
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gyre.errors import InvalidArgument
from services.scheduler.tasks import TaskSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class HarnessOffer:
    binary: str = ""
    binary_found: bool = True
    env_values: Mapping[str, str] = field(default_factory=dict)
    """harness_env keys the harness reads -> the pattern a value must fully match."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunnerOffer:
    runner_id: str
    harnesses: Mapping[str, HarnessOffer]
    task_sets: frozenset[str] = frozenset()
    task_set_tasks: frozenset[str] = frozenset()
    """`<set>/<task>` of every task of those sets."""
    template_url_prefixes: tuple[str, ...] = ()
    reserved_env: frozenset[str] = frozenset()


def offer_from_request(
    runner_id: str,
    harnesses: Mapping[str, HarnessOffer],
    *,
    task_sets: Iterable[str],
    task_set_tasks: Iterable[str],
    template_url_prefixes: Iterable[str],
    reserved_env: Iterable[str],
) -> RunnerOffer:
    """A runner's registration, checked: it names itself, and every value pattern compiles."""
    if not runner_id.strip() or len(runner_id) > 1000:
        raise InvalidArgument("runner_id", "is required (1..1000 characters)")
    for name, harness in harnesses.items():
        for key, pattern in harness.env_values.items():
            try:
                re.compile(pattern)
            except re.error as exc:
                raise InvalidArgument(
                    f"harnesses[{name!r}].env_values[{key!r}]", f"not a pattern: {exc}"
                ) from None
    return RunnerOffer(
        runner_id=runner_id,
        harnesses=dict(harnesses),
        task_sets=frozenset(task_sets),
        task_set_tasks=frozenset(task_set_tasks),
        template_url_prefixes=tuple(template_url_prefixes),
        reserved_env=frozenset(reserved_env),
    )


def check_offered(specs: Sequence[TaskSpec], offers: Sequence[RunnerOffer]) -> None:
    """Raise InvalidArgument naming the field of the first task no registered runner could run."""
    if not offers:
        return
    for i, spec in enumerate(specs):
        able = _able(spec, offers, f"tasks[{i}]")
        _check_template(spec.workspace_template, able, f"tasks[{i}].workspace_template")
        _check_env(spec, able, offers, f"tasks[{i}].harness_env")


def _able(spec: TaskSpec, offers: Sequence[RunnerOffer], at: str) -> list[RunnerOffer]:
    """The runners that could start the task's harness; refused when there is none."""
    having = [o for o in offers if spec.harness in o.harnesses]
    able = [o for o in having if o.harnesses[spec.harness].binary_found]
    if able:
        return able
    if having:
        binary = having[0].harnesses[spec.harness].binary
        raise InvalidArgument(
            f"{at}.harness",
            f"no registered runner can start {spec.harness!r}: its program {binary!r} is not on "
            f"the PATH of their sandboxes ({_names(o.runner_id for o in having)}; "
            "see GYRE_RUNNER_SANDBOX_RUNTIME)",
        )
    offered = sorted({h for o in offers for h in o.harnesses})
    raise InvalidArgument(
        f"{at}.harness", f"no registered runner offers {spec.harness!r}; offered: {_names(offered)}"
    )


def _check_template(template: str, able: Sequence[RunnerOffer], at: str) -> None:
    """The runners' own rules (services/runner/workspace.py), against what they registered."""
    if template.startswith("taskset:"):
        set_name, _, name = template.removeprefix("taskset:").partition("/")
        if not any(set_name in o.task_sets for o in able):
            known = _names(s for o in able for s in o.task_sets)
            raise InvalidArgument(at, f"no runner has the task set {set_name!r} (registered: {known})")
        if not any(f"{set_name}/{name}" in o.task_set_tasks for o in able):
            raise InvalidArgument(at, f"the task set {set_name!r} has no task {name!r}")
    elif template.startswith("git+") or template.endswith(".git"):
        url = template.removeprefix("git+")
        prefixes = [p for o in able for p in o.template_url_prefixes if p]
        if not any(url.startswith(p) for p in prefixes):
            allowed = _names(prefixes) if prefixes else "none: GYRE_RUNNER_TEMPLATE_URLS is empty"
            raise InvalidArgument(
                at, f"{url!r} is under none of the git URL prefixes the runners allow ({allowed})"
            )


def _check_env(spec: TaskSpec, able: Sequence[RunnerOffer], offers: Sequence[RunnerOffer], at: str) -> None:
    patterns = able[0].harnesses[spec.harness].env_values  # the adapter's, the same on every runner
    reserved = frozenset().union(*(o.reserved_env for o in able))
    for key, value in spec.harness_env:
        if key in reserved:
            raise InvalidArgument(
                f"{at}[{key!r}]", "is set by the runner (model URL, token, PATH) for every harness"
            )
        if key in patterns:
            if not re.fullmatch(patterns[key], value):
                raise InvalidArgument(
                    f"{at}[{key!r}]", f"{spec.harness} takes values matching {patterns[key]}, got {value!r}"
                )
            continue
        readers = sorted({h for o in offers for h, offer in o.harnesses.items() if key in offer.env_values})
        if readers:
            raise InvalidArgument(
                f"{at}[{key!r}]", f"is read by {_names(readers)}, not by {spec.harness}: it would do nothing"
            )


def _names(names: Iterable[str]) -> str:
    return ", ".join(sorted(set(names))) or "none"
