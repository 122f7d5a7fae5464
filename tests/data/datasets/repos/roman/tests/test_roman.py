import unittest

from roman import to_roman


class TestRoman(unittest.TestCase):
    def test_three(self):
        self.assertEqual(to_roman(3), "III")

    def test_thousand(self):
        self.assertEqual(to_roman(2026), "MMXXVI")
