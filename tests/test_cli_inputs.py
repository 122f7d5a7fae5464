"""Every input error of the `gyre` command is one line on stderr and exit code 2, never a traceback:
the inputs users met (a group size of 2^64, a tasks file that is not UTF-8, a lone surrogate, an
unwritable export folder) and a hypothesis fuzz of the commands' arguments and tasks files.

In-process (`gyre_app.cli.main`), with every service address on a closed port: a command whose
input passes its checks fails on the unreachable service instead, also one line (exit code 1).
No stack is needed, so nothing here waits on a service.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gyre_app.cli import main

INPUT_ERROR = 2
"""The exit code of an input error (gyre_app.cli.INPUT_ERROR)."""

SERVICES = ("SCHEDULER", "RUNNER", "TRAJECTORY", "TRAINER", "EVALUATOR", "PROXY")
TASK = {"name": "t", "family": "terminal", "prompt": "Do it.", "group_size": 1}
FUZZ = settings(
    max_examples=40,
    derandomize=True,  # the same examples every run, as the wire fuzz (tests/wire_fuzz.py)
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[Cli]:
    saved = structlog.get_config()  # `main` configures logging; later tests get theirs back
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    for service in SERVICES:
        monkeypatch.setenv(f"GYRE_{service}_ADDRESS", closed)
    monkeypatch.setenv("GYRE_STATE_DIR", str(tmp_path / "state"))
    yield Cli(tmp_path, capsys)
    structlog.configure(**saved)


class Cli:
    def __init__(self, tmp: Path, capsys: pytest.CaptureFixture[str]):
        self.tmp = tmp
        self.capsys = capsys

    def run(self, *argv: str) -> tuple[int, list[str]]:
        """Exit code and stderr lines; it fails the test when either breaks the contract."""
        self.capsys.readouterr()
        code = main(list(argv))
        lines = self.capsys.readouterr().err.strip().splitlines()
        assert code in (0, 1, INPUT_ERROR), (argv, code)
        if code:
            assert len(lines) == 1 and lines[0].startswith("gyre "), (argv, lines)
        return code, lines

    def file(self, data: bytes, name: str = "tasks.jsonl") -> str:
        path = self.tmp / name
        path.write_bytes(data)
        return str(path)


def test_a_group_size_of_2_to_the_64_is_one_line(cli: Cli) -> None:
    line = json.dumps({**TASK, "group_size": 2**64}).encode()
    code, err = cli.run("submit", cli.file(line))
    assert code == INPUT_ERROR and "line 1, field group_size: must be at most 4294967295" in err[0]
    code, err = cli.run("submit", "--task", "slugfix", "--group-size", str(2**64))
    assert code == INPUT_ERROR and "--group-size" in err[0]


def test_a_tasks_file_that_is_not_utf8_names_its_line(cli: Cli) -> None:
    data = json.dumps(TASK).encode() + b'\n{"name": "caf\xe9"}\n'
    code, err = cli.run("submit", cli.file(data))
    assert code == INPUT_ERROR and err[0].endswith("line 2: not UTF-8 text (byte 0xe9 at column 14)")


def test_a_lone_surrogate_in_a_name_is_one_line(cli: Cli) -> None:
    line = json.dumps({**TASK, "name": "half \ud800"}).encode()  # JSON's own escape: "\ud800"
    code, err = cli.run("submit", cli.file(line))
    assert code == INPUT_ERROR and "field name: must be Unicode text" in err[0]
    code, err = cli.run("tasks", "show", "\udcff")  # a byte the locale could not decode
    assert code == INPUT_ERROR and "is not UTF-8 text" in err[0]


def test_an_unwritable_trace_export_folder_is_one_line_before_any_service_is_asked(cli: Cli) -> None:
    below_a_file = Path(cli.file(b"", name="a-file")) / "out"
    code, err = cli.run("trace", "export", str(below_a_file), "--task", "t")
    assert code == INPUT_ERROR and "OUT_DIR" in err[0] and "Not a directory" in err[0]


def test_a_usage_error_is_one_line_with_exit_code_2(cli: Cli) -> None:
    code, err = cli.run("submit", "--group-size", "two")
    assert code == INPUT_ERROR and "--group-size" in err[0]


COMMANDS = st.sampled_from(
    [
        ["submit"],
        ["tasks", "list"],
        ["tasks", "show"],
        ["executions", "list"],
        ["executions", "show"],
        ["cancel"],
        ["trace", "export"],
    ]
)
OPTIONS = st.sampled_from(
    [
        "--task", "--group-size", "--timeout-s", "--harness", "--request-id", "--json", "--limit",
        "--state", "--page-token", "--name", "--cells", "--reason", "--microbatch-tokens", "--",
    ]
)  # fmt: skip
NUMBERS = st.sampled_from(["0", "-1", "2", str(2**32), str(2**64), "1e309", "nan", "inf", "-0", "0x10"])
TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    [
        "\udcff",
        "a\x00b",
        "slugfix",
        "\u202e",
        "🙂",
        "../..",
        "pending",
        "0190b6f0-0000-7000-8000-000000000000",
    ]
)
ODD_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
TASK_LINES = st.dictionaries(
    st.sampled_from(
        [*TASK, "timeout_s", "harness", "labels", "max_infra_retries", "workspace_template", "harness_env"]
    )
    | TEXT,
    ODD_JSON,
    max_size=8,
).map(lambda fields: json.dumps({**TASK, **fields}).encode())


@FUZZ
@given(command=COMMANDS, args=st.lists(OPTIONS | NUMBERS | TEXT | st.just("FILE"), max_size=6))
def test_fuzzed_arguments_end_in_one_line_never_a_traceback(
    cli: Cli, command: list[str], args: list[str]
) -> None:
    path = cli.file(json.dumps(TASK).encode())
    cli.run(*command, *(path if a == "FILE" else a for a in args))


@FUZZ
@given(data=st.binary(max_size=64) | st.lists(TASK_LINES, min_size=1, max_size=3).map(b"\n".join))
def test_fuzzed_tasks_files_end_in_one_line_never_a_traceback(cli: Cli, data: bytes) -> None:
    code, _ = cli.run("submit", cli.file(data))
    assert code != 0  # refused here, or (a valid file) by the unreachable scheduler
