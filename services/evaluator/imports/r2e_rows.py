"""R2E-Gym rows into task folders (pure).

An R2E-Gym row names its repository (`repo_name`), image (`docker_image`), problem statement,
the parsed commit (`parsed_commit_content`, JSON: `old_commit_hash`, `new_commit_hash`, file
diffs) and `expected_output_json`: test name -> the status the reference solution gets. Its tests
live in the image (`/root/r2e_tests`, run by `/root/run_tests.sh` from the repository), and
R2E-Gym names a test `Class.test` (the pytest node id without its file).

Converted to the SWE-bench family's grading. A row of R2E-Gym's own datasets also carries
`execution_result_content` (JSON: the test logs of the commit before and after the fix,
`old_commit_res_stdout` and `new_commit_res_stdout`); a test the reference passes that already
passed before the fix is PASS_TO_PASS, the others FAIL_TO_PASS, as R2E-Gym itself told them apart
when it built the row. Without that log (or when it parses to nothing) every test the reference
passes is FAIL_TO_PASS. A row that carries FAIL_TO_PASS / PASS_TO_PASS lists, as converted
copies do, keeps its own. Tests the reference solution fails are dropped: no patch can be asked
to fail them. The row's id is its
`instance_id` when present, else `<repo_name>__<commit_hash>`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.evaluator.imports.imported import (
    DEFAULT_GRADER_TIMEOUT_S,
    ImportedTask,
    Refusal,
    environment_table,
    task_name,
)
from services.evaluator.imports.row_fields import RowError, json_object, optional_text, test_ids, text
from services.evaluator.imports.swebench_rows import grading_table
from services.evaluator.test_logs import TestStatus, parse_test_log

WORKDIR = "/testbed"
# R2E-Gym links its held-out tests into the repository only while they run (its runtime does
# the same), then runs the image's script.
TEST_COMMAND = (
    "rm -rf r2e_tests; "
    "if [ -d /root/r2e_tests ]; then ln -s /root/r2e_tests r2e_tests; "
    "elif [ -d /r2e_tests ]; then ln -s /r2e_tests r2e_tests; fi; "
    "bash /root/run_tests.sh; status=$?; rm -f r2e_tests; exit $status"
)


def r2e_id(row: Mapping[str, Any]) -> str:
    """Example: {"repo_name": "aiohttp", "commit_hash": "f0d7488"} -> "aiohttp__f0d7488"."""
    own = optional_text(row, "instance_id")
    if own:
        return own
    return f"{text(row, 'repo_name')}__{text(row, 'commit_hash')}"


def import_r2e_row(row: Mapping[str, Any]) -> ImportedTask | Refusal:
    """One row into a task, or a refusal naming the instance and the field at fault."""
    instance_id = "?"
    try:
        instance_id = r2e_id(row)
        return _task(row, instance_id)
    except RowError as err:
        return Refusal(id=instance_id, field=err.field, why=err.why)


def passed_before(row: Mapping[str, Any]) -> frozenset[str]:
    """Tests that passed at the old commit, from the row's `execution_result_content` (empty
    when the row has none: then nothing is known to pass before the fix).

    Example: {"execution_result_content": '{"old_commit_res_stdout":
              "PASSED r2e_tests/test_1.py::TestX::test_a"}'} -> {"TestX.test_a"}
    """
    raw = row.get("execution_result_content")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return frozenset()
    result = json_object(row, "execution_result_content")
    log = result.get("old_commit_res_stdout")
    if log is None:
        return frozenset()
    if not isinstance(log, str):
        raise RowError("execution_result_content", "old_commit_res_stdout must be the test log as text")
    parsed = parse_test_log("r2e", log)
    return frozenset(k.split(" - ")[0] for k, v in parsed.items() if v == TestStatus.PASSED)


def _task(row: Mapping[str, Any], instance_id: str) -> ImportedTask:
    repo = text(row, "repo_name")
    image = text(row, "docker_image")
    prompt = text(row, "problem_statement")
    commit = json_object(row, "parsed_commit_content")
    old = commit.get("old_commit_hash")
    if not isinstance(old, str) or not old.strip():
        raise RowError("parsed_commit_content", "must give old_commit_hash (the commit the image starts at)")
    if "FAIL_TO_PASS" in row:
        fail_to_pass, pass_to_pass = test_ids(row, "FAIL_TO_PASS"), test_ids(row, "PASS_TO_PASS")
    else:
        expected = json_object(row, "expected_output_json")
        if not all(isinstance(v, str) for v in expected.values()):
            raise RowError("expected_output_json", "must map each test name to a status string")
        passing = sorted({k.split(" - ")[0] for k, v in expected.items() if v.upper() == "PASSED"})
        before = passed_before(row)
        fail_to_pass = [k for k in passing if k not in before]
        pass_to_pass = [k for k in passing if k in before]
    if not fail_to_pass:
        raise RowError("expected_output_json", "names no test the reference solution passes")
    source: dict[str, Any] = {"format": "r2e", "id": instance_id, "repo": repo, "base_commit": old.strip()}
    files = {"hidden/test.patch": ""}
    gold = optional_text(row, "patch")
    if gold:
        files["hidden/gold.patch"] = gold if gold.endswith("\n") else gold + "\n"
    return ImportedTask(
        name=task_name(instance_id),
        family="swebench",
        prompt=prompt,
        grader_timeout_s=DEFAULT_GRADER_TIMEOUT_S,
        source=source,
        environment=environment_table(image=image, workdir=WORKDIR),
        grading=grading_table(
            optional_text(row, "test_command") or TEST_COMMAND, "r2e", fail_to_pass, pass_to_pass
        ),
        files=files,
    )
