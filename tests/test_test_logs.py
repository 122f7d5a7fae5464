"""Test-log parsers: real runner output in, test id -> status out."""

from __future__ import annotations

import pytest

from gyre.errors import InvalidArgument
from services.evaluator.test_logs import PARSERS, TestStatus, parse_test_log

P, F, S, E = TestStatus.PASSED, TestStatus.FAILED, TestStatus.SKIPPED, TestStatus.ERROR

PYTEST_RA = """\
============================= test session starts ==============================
platform linux -- Python 3.11.9, pytest-8.3.3, pluggy-1.5.0
rootdir: /testbed
collected 9 items

tests/test_calc.py .F.sxX.E                                              [100%]

==================================== ERRORS ====================================
_________________________ ERROR at setup of test_conn __________________________
E   fixture 'db' not found
=================================== FAILURES ===================================
___________________________________ test_div ___________________________________
    def test_div():
>       assert div(1, 0) == 0
E       ZeroDivisionError: division by zero
==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED tests/test_calc.py::test_add
PASSED tests/test_calc.py::test_slug[Hello   World-hello-world]
PASSED tests/test_calc.py::TestParse::test_nested[x[1]-y]
XFAIL tests/test_calc.py::test_known - reason: not yet
XPASS tests/test_calc.py::test_lucky luck
SKIPPED [1] tests/test_calc.py:40: needs network
FAILED tests/test_calc.py::test_div - ZeroDivisionError: division by zero
FAILED tests/test_calc.py::test_msg[a - b] - AssertionError: [1] != [2]
ERROR tests/test_calc.py::test_conn - fixture 'db' not found
ERROR tests/test_broken.py - ImportError: no module named nope
============= 2 failed, 3 passed, 1 skipped, 1 xfailed, 1 xpassed, 2 errors in 0.12s =============
"""


def test_pytest_summary_lines_give_each_node_id_its_status() -> None:
    assert parse_test_log("pytest", PYTEST_RA) == {
        "tests/test_calc.py::test_add": P,
        "tests/test_calc.py::test_slug[Hello   World-hello-world]": P,
        "tests/test_calc.py::test_slug[Hello": P,
        "tests/test_calc.py::TestParse::test_nested[x[1]-y]": P,
        "tests/test_calc.py::test_known": P,
        "tests/test_calc.py::test_lucky": P,
        "tests/test_calc.py::test_div": F,
        "tests/test_calc.py::test_msg[a - b]": F,
        "tests/test_calc.py::test_msg[a": F,
        "tests/test_calc.py::test_conn": E,
    }


def test_pytest_skip_and_collection_error_lines_name_no_test() -> None:
    found = parse_test_log("pytest", PYTEST_RA)
    assert not any(k.startswith("[1]") or k == "tests/test_broken.py" for k in found)


def test_pytest_verbose_progress_lines_with_colours() -> None:
    log = (
        "\x1b[1mtests/test_a.py::test_x \x1b[32mPASSED\x1b[0m\x1b[32m                 [ 33%]\x1b[0m\n"
        "tests/test_a.py::test_y[with space] FAILED                       [ 66%]\n"
        "tests/test_a.py::test_z SKIPPED (no db)                          [100%]\n"
        "tests/test_a.py::test_w XFAIL\n"
    )
    assert parse_test_log("pytest", log) == {
        "tests/test_a.py::test_x": P,
        "tests/test_a.py::test_y[with space]": F,
        "tests/test_a.py::test_y[with": F,
        "tests/test_a.py::test_z": S,
        "tests/test_a.py::test_w": P,
    }


def test_pytest_id_with_a_space_is_also_found_as_swebench_rows_name_it() -> None:
    found = parse_test_log("pytest", "PASSED t.py::test_a[x y]\nFAILED t.py::test_a[x z] - boom\n")
    assert found["t.py::test_a[x y]"] == P and found["t.py::test_a[x z]"] == F
    assert found["t.py::test_a[x"] == F  # two ids share the cut form: the worse status stands


def test_pytest_error_in_teardown_outranks_the_pass() -> None:
    log = "PASSED t.py::test_a\nERROR t.py::test_a - teardown failed\nPASSED t.py::test_b\n"
    assert parse_test_log("pytest", log) == {"t.py::test_a": E, "t.py::test_b": P}


def test_pytest_unbalanced_bracket_in_parameters_ends_before_the_message() -> None:
    log = "FAILED t.py::test_p[a]b] - assert 0\nPASSED t.py::test_q[(]\n"
    assert parse_test_log("pytest", log) == {"t.py::test_p[a]b]": F, "t.py::test_q[(]": P}


def test_pytest_output_without_tests_parses_to_nothing() -> None:
    assert parse_test_log("pytest", "ERROR: file or directory not found: tests/nope.py\n") == {}


def test_unknown_parser_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_test_log("nosuch", "")
    assert err.value.field == "log_parser" and "pytest" in err.value.problem


def test_every_parser_takes_an_empty_log() -> None:
    assert all(parser("") == {} for parser in PARSERS.values())


def test_pytest_options_keeps_the_last_part_of_a_path_parameter() -> None:
    log = (
        "PASSED t.py::test_load[/tmp/pytest-of-root/pytest-7/data/a.dcm]\n"
        "PASSED t.py::test_url[//host/x]\nPASSED t.py::test_glob[/a/*.py]\n"
    )
    assert parse_test_log("pytest_options", log) == {
        "t.py::test_load[/a.dcm]": P,
        "t.py::test_url[//host/x]": P,
        "t.py::test_glob[/a/*.py]": P,
    }


def test_matplotlib_names_mouse_buttons_by_number() -> None:
    log = "PASSED lib/t.py::test_click[MouseButton.LEFT]\nFAILED lib/t.py::test_click[MouseButton.RIGHT]\n"
    assert parse_test_log("matplotlib", log) == {"lib/t.py::test_click[1]": P, "lib/t.py::test_click[3]": F}


DJANGO_LOG = """\
Testing against Django installed in '/testbed/django'
Importing application calc
test_add (calc.tests.CalcTests) ... ok
test_div (calc.tests.CalcTests) ... Creating test database for alias 'default'...
System check identified no issues (0 silenced).
ok
test_io (calc.tests.CalcTests.test_io) ... ERROR
test_net (calc.tests.CalcTests) ... skipped 'no network'
test_old (calc.tests.CalcTests) ... expected failure
test_new (calc.tests.CalcTests) ... unexpected success
test_sub (calc.tests.CalcTests)
Subtraction keeps the sign of the larger operand. ... FAIL

======================================================================
ERROR: test_io (calc.tests.CalcTests.test_io)
----------------------------------------------------------------------
Traceback (most recent call last):
OSError: boom
======================================================================
FAIL: test_late (calc.tests.CalcTests)
----------------------------------------------------------------------
Ran 8 tests in 0.010s

FAILED (failures=2, errors=1, skipped=1)
"""


def test_django_runner_lines_and_failure_headers() -> None:
    assert parse_test_log("django", DJANGO_LOG) == {
        "test_add (calc.tests.CalcTests)": P,
        "test_div (calc.tests.CalcTests)": P,
        "test_io (calc.tests.CalcTests.test_io)": E,
        "test_net (calc.tests.CalcTests)": S,
        "test_old (calc.tests.CalcTests)": P,
        "test_new (calc.tests.CalcTests)": F,
        "Subtraction keeps the sign of the larger operand.": F,
        "test_late (calc.tests.CalcTests)": F,
    }


def test_django_output_between_a_test_and_a_later_test_is_not_a_verdict() -> None:
    log = "test_a (m.T) ... Internal Server Error: /x/\ntest_b (m.T) ... ok\nok\n"
    assert parse_test_log("django", log) == {"test_b (m.T)": P}


SYMPY_LOG = """\
============================= test process starts ==============================
executable:         /usr/bin/python  (3.9.19-final-0) [CPython]
sympy/core/tests/test_basic.py[5]
test_equality ok
test_atoms F
test_known f
test_slow s
test_boom E

________________________________________________________________________________
__________________ sympy/core/tests/test_basic.py:test_late ____________________
AssertionError
============= tests finished: 2 passed, 1 failed, 1 skipped, 1 exceptions =============
"""


def test_sympy_verbose_lines_and_failure_headers() -> None:
    assert parse_test_log("sympy", SYMPY_LOG) == {
        "test_equality": P,
        "test_atoms": F,
        "test_known": P,
        "test_slow": S,
        "test_boom": E,
        "test_late": F,
    }


def test_go_test_verbose_with_subtests() -> None:
    log = (
        "=== RUN   TestAdd\n--- PASS: TestAdd (0.00s)\n=== RUN   TestSplit/empty\n"
        "    --- FAIL: TestSplit/empty (0.01s)\n--- FAIL: TestSplit (0.01s)\n--- SKIP: TestNet (0.00s)\n"
        "FAIL\tgithub.com/x/y [build failed]\n"
    )
    assert parse_test_log("go_test", log) == {
        "TestAdd": P,
        "TestSplit/empty": F,
        "TestSplit": F,
        "TestNet": S,
    }


def test_cargo_test_lines() -> None:
    log = (
        "running 4 tests\ntest parse::tests::empty ... ok\ntest parse::tests::long ... FAILED\n"
        "test parse::tests::slow ... ignored, needs a day\ntest src/lib.rs - add (line 3) ... ok\n"
        "test result: FAILED. 2 passed; 1 failed; 1 ignored\n"
    )
    assert parse_test_log("cargo", log) == {
        "parse::tests::empty": P,
        "parse::tests::long": F,
        "parse::tests::slow": S,
        "src/lib.rs - add (line 3)": P,
    }
