"""Repository generation instances: write a small package from a spec (pure).

One hidden test file per function, weights equal, and a completion bonus (a quarter of a
function's weight is earned only when all its tests pass), so partial work earns partial credit.
`README.md` is in the starting workspace and is what `requires` names: a run that wrote nothing
is a policy outcome scored 0, not an unassessable one.
"""

from __future__ import annotations

import json

from services.evaluator.generate.instance import Step, TaskInstance, rng_for
from services.evaluator.taskset import Check

FAMILY = "repo_generation"
PACKAGES = ("shapes", "textkit", "helpers", "toolbox", "numkit", "wordkit")
# name -> (body, words for the prompt, argument samples as source text, argument name)
FUNCTIONS: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    "plus": ("x + {k}", "x plus {k}", ("0", "4", "10"), "x"),
    "times": ("x * {k}", "x times {k}", ("1", "3", "6"), "x"),
    "neg": ("-x", "minus x", ("0", "5", "-2"), "x"),
    "shout": ("s.upper()", "s upper-cased", ("'a'", "'Hi'", "'ok go'"), "s"),
    "first": ("xs[0]", "the first item of xs", ("[1]", "[4, 2]", "['a', 'b']"), "xs"),
    "size": ("len(xs)", "the number of items in xs", ("[]", "[1, 2]", "'abc'"), "xs"),
}


def _source(name: str, k: int) -> str:
    body, _, _, arg = FUNCTIONS[name]
    return f"def {name}({arg}):\n    return {body.format(k=k)}\n"


def _test(package: str, name: str, k: int) -> tuple[str, str]:
    """A hidden test file whose tests return the value under test, and its expected values (JSON)."""
    body, _, samples, arg = FUNCTIONS[name]
    out = ["# Each test returns the value under test; the grader compares it with the .expected.json.\n"]
    out.append(f"from {package}.core import {name}\n")
    expected = {}
    for i, sample in enumerate(samples):
        expected[f"test_{name}_{i}"] = eval(
            body.format(k=k), {}, {arg: eval(sample)}
        )  # our own template text
        out.append(f"\n\ndef test_{name}_{i}():\n    return {name}({sample})\n")
    return "".join(out), json.dumps(expected)


def _hidden(package: str, chosen: list[str], k: int) -> dict[str, str]:
    files = {}
    for f in chosen:
        files[f"hidden/test_{f}.py"], files[f"hidden/test_{f}.expected.json"] = _test(package, f, k)
    return files


def generate(*, name: str, seed: int, index: int) -> TaskInstance:
    rng = rng_for(FAMILY, seed, index)
    package = rng.choice(PACKAGES)
    chosen = sorted(rng.sample(sorted(FUNCTIONS), 2))
    k = rng.randint(2, 9)
    spec = "\n".join(f"- `{f}({FUNCTIONS[f][3]})` returning {FUNCTIONS[f][1].format(k=k)}" for f in chosen)
    core = f"{package}/core.py"
    prompt = f"Create a Python package `{package}` ({package}/__init__.py) with {core} defining:\n{spec}"
    weight = round(1 / len(chosen), 6)
    write_core = Step(
        tool="write_file", arguments={"path": core, "content": "\n\n".join(_source(f, k) for f in chosen)}
    )
    delegate = rng.random() < 0.5
    return TaskInstance(
        name=name,
        family=FAMILY,
        prompt=prompt,
        requires=("README.md",),
        workspace={"README.md": f"# {package}\n"},
        hidden=_hidden(package, chosen, k),
        checks=tuple(
            Check(name=f"{package}.{f}", tests=f"hidden/test_{f}.py", weight=weight) for f in chosen
        ),
        completion_bonus=0.25,
        solution=(
            Step(tool="write_file", arguments={"path": f"{package}/__init__.py", "content": ""}),
            write_core,
            Step(tool="shell", arguments={"command": f"python -c 'import {package}.core'"}),
        ),
        # Half the instances hand the module to a sub-agent, so warm-start transcripts hold both.
        delegate=f"Write {core} defining:\n{spec}" if delegate else "",
        meta={"functions": chosen, "k": k},
    )
