import pytest
from stack import Stack


class TestStack:
    def test_push_pop(self):
        s = Stack()
        s.push(1)
        assert s.pop() == 1 and len(s) == 0

    def test_pop_empty_raises(self):
        with pytest.raises(IndexError):
            Stack().pop()

    def test_peek_empty_raises(self):
        with pytest.raises(IndexError):
            Stack().peek()
