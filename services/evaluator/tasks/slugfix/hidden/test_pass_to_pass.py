# Each test returns the value under test; the grader compares it, serialised, with
# test_pass_to_pass.expected.json outside the tested process.
from slug import slugify


def test_simple():
    return slugify("Hello World")


def test_digits():
    return slugify("Top 10")
