"""Repository repair instances: a small package with one broken function (pure).

SWE-style: the repository, a failing test set (`fail_to_pass`, weight 0.7: the broken function)
and a passing one (`pass_to_pass`, weight 0.3: the functions that work, also visible in
`tests/`). Partial credit: a fix that breaks a working function, or half a fix, earns part.
"""

from __future__ import annotations

import json

from services.evaluator.generate.instance import Step, TaskInstance, rng_for
from services.evaluator.taskset import Check

FAMILY = "repo_repair"
PACKAGES = ("calc", "mathkit", "numlib", "arith", "tally", "measure")
# name -> (correct body, broken body, words for the prompt, argument samples); {k} is a constant
FUNCTIONS: dict[str, tuple[str, str, str, tuple[int, ...]]] = {
    "add": ("x + {k}", "x - {k}", "x plus {k}", (0, 5, 11)),
    "scale": ("x * {k}", "x + {k}", "x times {k}", (1, 3, 7)),
    "half": ("x // 2", "x // 3", "x divided by 2, rounded down", (4, 9, 12)),
    "above": ("x > {k}", "x < {k}", "whether x is greater than {k}", (0, 6, 20)),
    "cap": ("min(x, {k})", "max(x, {k})", "x, but at most {k}", (1, 8, 30)),
}


def _module(bodies: dict[str, str]) -> str:
    return "\n\n".join(f"def {name}(x):\n    return {body}\n" for name, body in bodies.items())


def _value(body: str, x: int) -> object:
    return eval(body, {"__builtins__": {"min": min, "max": max}}, {"x": x})  # our own template text


def _tests(package: str, bodies: dict[str, str]) -> tuple[str, str]:
    """A hidden test file whose tests return the value under test, and its expected values (JSON)."""
    out = ["# Each test returns the value under test; the grader compares it with the .expected.json.\n"]
    out.append(f"from {package}.ops import {', '.join(bodies)}\n")
    expected = {}
    for name, body in bodies.items():
        for x in FUNCTIONS[name][3]:
            out.append(f"\n\ndef test_{name}_{x}():\n    return {name}({x})\n")
            expected[f"test_{name}_{x}"] = _value(body, x)
    return "".join(out), json.dumps(expected)


def _visible_tests(package: str, bodies: dict[str, str]) -> str:
    """The workspace's own tests (plain asserts: the agent runs them with pytest)."""
    out = [f"from {package}.ops import {', '.join(bodies)}\n"]
    for name, body in bodies.items():
        for x in FUNCTIONS[name][3]:
            out.append(f"\n\ndef test_{name}_{x}() -> None:\n    assert {name}({x}) == {_value(body, x)!r}\n")
    return "".join(out)


def _hidden(package: str, checks: dict[str, dict[str, str]]) -> dict[str, str]:
    files = {}
    for check, bodies in checks.items():
        tests, expected = _tests(package, bodies)
        files[f"hidden/test_{check}.py"] = tests
        files[f"hidden/test_{check}.expected.json"] = expected
    return files


def generate(*, name: str, seed: int, index: int) -> TaskInstance:
    rng = rng_for(FAMILY, seed, index)
    package = rng.choice(PACKAGES)
    chosen = rng.sample(sorted(FUNCTIONS), 3)
    k = rng.randint(2, 9)
    broken = rng.choice(chosen)
    good = {f: FUNCTIONS[f][0].format(k=k) for f in chosen}
    bad = dict(good) | {broken: FUNCTIONS[broken][1].format(k=k)}
    working = {f: b for f, b in good.items() if f != broken}
    path = f"{package}/ops.py"
    prompt = (
        f"`{package}.ops.{broken}` is wrong: it must return {FUNCTIONS[broken][2].format(k=k)}. "
        f"Fix {path} so the existing tests in tests/ still pass."
    )
    return TaskInstance(
        name=name,
        family=FAMILY,
        prompt=prompt,
        requires=(path,),
        workspace={
            f"{package}/__init__.py": "",
            path: _module(bad),
            "tests/test_ops.py": _visible_tests(package, working),
        },
        hidden=_hidden(package, {"fail_to_pass": {broken: good[broken]}, "pass_to_pass": working}),
        checks=(
            Check(name="fail_to_pass", tests="hidden/test_fail_to_pass.py", weight=0.7),
            Check(name="pass_to_pass", tests="hidden/test_pass_to_pass.py", weight=0.3),
        ),
        # Read, fix, check: no test run first, whose long output a tiny policy cannot read past.
        solution=(
            Step(tool="read_file", arguments={"path": path}),
            Step(tool="write_file", arguments={"path": path, "content": _module(good)}),
            Step(tool="run_tests", arguments={}),
        ),
        meta={"broken": broken, "k": k},
    )
