"""Judge what the sandboxed pytest reported through the host's pipe (pure).

The tested code runs in the same process as pytest, so nothing it reports can be trusted by
itself. Two checks make a forged grade visible:
- every hidden test file gets a canary test with a random name appended (`with_canary`) that
  must fail: a conftest, plugin or monkeypatch that turns failures into passes turns it too;
- each (test, phase) is reported once and only for the hidden files: code that writes its own
  lines into the pipe duplicates or adds records.
A forged run scores 0 (assessable: the work was there, it cheated). A run that stops before
every file's canary ran is a crash (retried, then `not assessable`), not a verdict.

Example: files {"test_a.py": "hidden/test_a.py"}, canaries {"test_a.py": "test_c1"}, records
    {"kind": "test", "nodeid": "test_a.py::test_x", "when": "call", "outcome": "passed"}
    {"kind": "test", "nodeid": "test_a.py::test_c1", "when": "call", "outcome": "failed"}
    {"kind": "end", "exitstatus": 1}   (setup/teardown lines left out here)
-> GraderRun(outcomes={"hidden/test_a.py": ["passed"]})
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from services.evaluator.scoring import ERRORED, FAILED, PASSED, SKIPPED, GraderRun

CANARY_BODY = "\n\n\ndef {name}():\n    assert 1 == 0\n"


def with_canary(source: str, name: str) -> str:
    """A hidden test file with a test that must fail appended (`name` is random per grade)."""
    return source.rstrip("\n") + CANARY_BODY.format(name=name)


def judge_records(
    lines: Sequence[str], *, files: Mapping[str, str], canaries: Mapping[str, str]
) -> GraderRun:
    """Outcomes per hidden file from the reporter's lines; `files`: file name -> check's path."""
    phases: dict[str, dict[str, str]] = {}
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
        if kind == "end":
            ended = True
            continue
        nodeid = str(rec.get("nodeid", ""))
        file = nodeid.split("::", 1)[0]
        if file not in files:
            return _forged(f"a result for {nodeid!r}, which is not a hidden test")
        if kind == "collect":
            if file in collect_failed or file in {k.split("::", 1)[0] for k in phases}:
                return _forged(f"{file} reported twice")
            collect_failed.add(file)
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
        if file in collect_failed:
            continue
        got = phases.get(f"{file}::{canary}", {})
        if got.get("call") == "passed" or (got and "call" not in got and got.get("setup") == "passed"):
            return _forged(f"the canary test of {file}, which must fail, passed")
        if got.get("call") != "failed":
            return GraderRun(outcomes={}, error=f"the test run stopped before {file} was done")
    if not ended:
        return GraderRun(outcomes={}, error="the test run stopped before the end of the session")
    outcomes: dict[str, list[str]] = {path: [] for path in files.values()}
    for file in collect_failed:
        outcomes[files[file]].append(ERRORED)
    for nodeid, seen in phases.items():
        file, _, name = nodeid.partition("::")
        if name == canaries.get(file):
            continue
        outcomes[files[file]].append(_test_outcome(seen))
    return GraderRun(outcomes=outcomes)


def _test_outcome(seen: Mapping[str, str]) -> str:
    if seen.get("setup") == "failed" or seen.get("teardown") == "failed":
        return ERRORED
    if seen.get("setup") == "skipped" or seen.get("call") == "skipped":
        return SKIPPED
    if seen.get("call") == "passed":
        return PASSED
    if seen.get("call") == "failed":
        return FAILED
    return ERRORED  # set up but never called: the run was cut short


def _forged(why: str) -> GraderRun:
    return GraderRun(outcomes={}, tampered=why)
