# Each test returns the value under test; the grader compares it, serialised, with
# test_count.expected.json outside the tested process.
from wordfreq.count import top


def test_most_frequent_first():
    return top("b a b c b a", 2)


def test_ties_alphabetical():
    return top("z y x", 3)


def test_n_larger_than_vocabulary():
    return top("one", 5)
