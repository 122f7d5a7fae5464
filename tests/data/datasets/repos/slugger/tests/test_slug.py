from slugger import slugify


def test_simple():
    assert slugify("Hello World") == "hello-world"


def test_digits():
    assert slugify("Top 10") == "top-10"
