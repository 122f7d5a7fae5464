"""Arithmetic on numbers."""


def add(a, b):
    return a + b


def sub(a, b):
    return a - b


def divide(a, b):
    return a // b


def mean(values):
    return sum(values) // len(values)
