from wordfreq.tokenize import words


def test_lower_cases() -> None:
    assert words("Hello World") == ["hello", "world"]


def test_keeps_apostrophes() -> None:
    assert words("don't stop") == ["don't", "stop"]


def test_drops_digits_and_punctuation() -> None:
    assert words("a1b, c!") == ["a", "b", "c"]


def test_empty() -> None:
    assert words("") == []
