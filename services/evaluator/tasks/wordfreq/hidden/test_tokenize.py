# Each test returns the value under test; the grader compares it, serialised, with
# test_tokenize.expected.json outside the tested process.
from wordfreq.tokenize import words


def test_lower_cases():
    return words("Hello World")


def test_keeps_apostrophes():
    return words("don't stop")


def test_drops_digits_and_punctuation():
    return words("a1b, c!")


def test_empty():
    return words("")
