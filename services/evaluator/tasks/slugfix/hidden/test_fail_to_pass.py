from slug import slugify


def test_collapses_runs() -> None:
    assert slugify("Hello   World") == "hello-world"


def test_strips_edges() -> None:
    assert slugify("--Hi!--") == "hi"
