from slug import slugify


def test_simple() -> None:
    assert slugify("Hello World") == "hello-world"


def test_digits() -> None:
    assert slugify("Top 10") == "top-10"
