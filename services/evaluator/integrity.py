"""Judge what the sandboxed pytest reported through the host's pipe (pure).

The tested code runs in the same process as pytest, so nothing it says can be trusted by itself:
- a test passes only when its call phase passed *and* the value it returned, serialised inside
  as plain JSON (no object of the solution survives), equals the expected value the grader keeps
  on the host (`<tests>.expected.json`, never copied into the sandbox). An object whose `__eq__`
  always says True, a plugin that flips failures to passes or a forged "passed" line earns
  nothing without the expected value, which the tested code never sees;
- the exact set of expected test ids is judged: a skipped, errored or missing test counts as
  failed, so skipping what it cannot answer does not shrink the denominator;
- each (test, phase) and each value is reported once, only for the hidden files, and a canary
  test with a random name (`with_canary`) must fail: a duplicate, a test that is not expected
  (e.g. injected into the hidden module's globals) or a passing canary is forgery (scores 0).

Example: expected {"test_a.py": {"test_x": [1, 2]}}, canary "test_c1", records
    {"kind": "test", "nodeid": "test_a.py::test_x", "when": "call", "outcome": "passed"}
    {"kind": "value", "nodeid": "test_a.py::test_x", "value": [1, 2]}
    {"kind": "test", "nodeid": "test_a.py::test_c1", "when": "call", "outcome": "failed"}
    {"kind": "end", "exitstatus": 1}   (setup/teardown lines left out here)
-> GraderRun(outcomes={"hidden/test_a.py": ["passed"]})
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from services.evaluator.scoring import ERRORED, FAILED, PASSED, GraderRun

CANARY_BODY = "\n\n\ndef {name}():\n    assert 1 == 0\n"


def with_canary(source: str, name: str) -> str:
    """A hidden test file with a test that must fail appended (`name` is random per grade)."""
    return source.rstrip("\n") + CANARY_BODY.format(name=name)


def judge_records(
    lines: Sequence[str],
    *,
    files: Mapping[str, str],
    expected: Mapping[str, Mapping[str, Any]],
    canaries: Mapping[str, str],
) -> GraderRun:
    """Outcomes per hidden file from the reporter's lines; `files`: file name -> check's path;
    `expected`: file name -> test name -> the value the test must return."""
    phases: dict[str, dict[str, str]] = {}
    values: dict[str, Any] = {}
    collect_failed: set[str] = set()
    ended = False
    for n, line in enumerate(lines, 1):
        try:
            rec = json.loads(line)
            kind = rec["kind"]
        except (ValueError, TypeError, KeyError):
            return _forged(f"report line {n} is not the reporter's: {line[:80]!r}")
        if ended:
            return _forged(f"report line {n} came after the end of the session")
        if kind == "start":
            if n != 1:
                return _forged(f"report line {n} starts a second session")
            continue
        if kind == "end":
            ended = True
            continue
        nodeid = str(rec.get("nodeid", ""))
        file, _, name = nodeid.partition("::")
        if file not in files:
            return _forged(f"a result for {nodeid!r}, which is not a hidden test")
        if name and name not in expected.get(file, {}) and name != canaries.get(file):
            return _forged(f"a result for {nodeid!r}, which is not an expected test")
        if kind == "collect":
            if file in collect_failed:
                return _forged(f"{file} reported twice")
            collect_failed.add(file)
        elif kind == "value":
            if nodeid in values:
                return _forged(f"{nodeid} returned twice")
            values[nodeid] = rec.get("value")
        elif kind == "test":
            when, outcome = rec.get("when"), rec.get("outcome")
            seen = phases.setdefault(nodeid, {})
            if when not in ("setup", "call", "teardown") or outcome not in ("passed", "failed", "skipped"):
                return _forged(f"line {n} has an unknown phase or outcome")
            if when in seen:
                return _forged(f"{nodeid} {when} reported twice")
            seen[str(when)] = str(outcome)
        else:
            return _forged(f"line {n} has an unknown kind {kind!r}")
    for file, canary in canaries.items():
        if phases.get(f"{file}::{canary}", {}).get("call") == "passed":
            return _forged(f"the canary test of {file}, which must fail, passed")
    if not lines:  # the reporter writes `start` before any code of the workspace runs
        return GraderRun(outcomes={}, error="the reporter never started")
    outcomes: dict[str, list[str]] = {}
    for file, path in files.items():
        outcomes[path] = [
            _outcome(phases.get(f"{file}::{name}", {}), values, f"{file}::{name}", want)
            if file not in collect_failed
            else ERRORED
            for name, want in sorted(expected.get(file, {}).items())
        ]
    return GraderRun(outcomes=outcomes)  # a run cut short (not `ended`): what never ran failed


def _outcome(seen: Mapping[str, str], values: Mapping[str, Any], nodeid: str, want: Any) -> str:
    """passed only with every phase passed and the expected value; skipped or missing fails."""
    if seen.get("setup") == "failed" or seen.get("teardown") == "failed":
        return ERRORED
    if seen.get("call") != "passed" or nodeid not in values:
        return FAILED
    return PASSED if _canonical(values[nodeid]) == _canonical(want) else FAILED


def _canonical(value: Any) -> str:
    """Plain JSON text: `true` and `1`, `1` and `1.0` stay different, key order does not matter."""
    return json.dumps(value, sort_keys=True)


def _forged(why: str) -> GraderRun:
    return GraderRun(outcomes={}, tampered=why)
