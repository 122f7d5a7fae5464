from wordfreq.count import top


def test_most_frequent_first() -> None:
    assert top("b a b c b a", 2) == [("b", 3), ("a", 2)]


def test_ties_alphabetical() -> None:
    assert top("z y x", 3) == [("x", 1), ("y", 1), ("z", 1)]


def test_n_larger_than_vocabulary() -> None:
    assert top("one", 5) == [("one", 1)]
