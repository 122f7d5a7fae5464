# Each test returns the value under test; the grader compares it, serialised, with
# test_fail_to_pass.expected.json outside the tested process.
from slug import slugify


def test_collapses_runs():
    return slugify("Hello   World")


def test_strips_edges():
    return slugify("--Hi!--")
