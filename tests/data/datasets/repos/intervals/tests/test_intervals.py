from intervals import covers, merge


def test_overlap_merge():
    assert merge([(1, 5), (3, 8)]) == [(1, 8)]


def test_covers_inside():
    assert covers([(1, 5)], 2)
