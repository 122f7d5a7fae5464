"""The task families `gyre tasks generate` knows, and how a set is split (pure).

To add a family: write a module with `FAMILY` (the evaluator's family name: its grader) and
`generate(*, name, seed, index) -> TaskInstance`, and register it in `GENERATORS` under the
name users type. See docs/tutorials/own-tasks.md, "Generated families".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gyre.errors import InvalidArgument
from services.evaluator.generate import repair, repo_gen, terminal
from services.evaluator.generate.instance import TaskInstance

Generator = Callable[..., TaskInstance]
GENERATORS: dict[str, Generator] = {
    "repo-gen": repo_gen.generate,
    "repair": repair.generate,
    "terminal": terminal.generate,
}
HELDOUT_EVERY = 4
"""Every 4th instance of a family (index 3, 7, ...) is held out: 25 %, the same at any count."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedTask:
    family: str
    index: int
    split: str
    """`train` or `heldout`."""

    @property
    def name(self) -> str:
        return f"{self.family}-{self.index:04d}"


def parse_families(text: str) -> list[str]:
    """`repo-gen,repair` or `all` -> the family names, validated, in the order given.

    Example:
        parse_families("all") -> ["repo-gen", "repair", "terminal"]
    """
    names = list(GENERATORS) if text.strip() == "all" else [f.strip() for f in text.split(",") if f.strip()]
    unknown = [f for f in names if f not in GENERATORS]
    if not names or unknown:
        raise InvalidArgument(
            "family",
            f"unknown family {', '.join(unknown) or repr(text)}: expected {', '.join(GENERATORS)} or all",
        )
    return list(dict.fromkeys(names))


def plan(families: Sequence[str], *, count: int) -> list[PlannedTask]:
    """`count` instances of each family with their split."""
    if count < 1:
        raise InvalidArgument("count", f"must be a positive number of instances per family, got {count}")
    return [
        PlannedTask(family=f, index=i, split="heldout" if i % HELDOUT_EVERY == HELDOUT_EVERY - 1 else "train")
        for f in families
        for i in range(count)
    ]


def build(task: PlannedTask, *, seed: int) -> TaskInstance:
    return GENERATORS[task.family](name=task.name, seed=seed, index=task.index)
