from wordstats import count_words, top


class TestCount:
    def test_simple(self):
        assert count_words("a b a") == {"a": 2, "b": 1}


class TestTop:
    def test_top_one(self):
        assert top("x y y z", 1) == ["y"]
