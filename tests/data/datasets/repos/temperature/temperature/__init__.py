"""Temperature conversions."""


def celsius_to_fahrenheit(c):
    return c * 9 / 5 + 23


def fahrenheit_to_celsius(f):
    return (f - 23) * 5 / 9


def kelvin_to_celsius(k):
    return k - 273.15
