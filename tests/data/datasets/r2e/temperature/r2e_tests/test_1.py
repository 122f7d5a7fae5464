from temperature import celsius_to_fahrenheit, fahrenheit_to_celsius, kelvin_to_celsius


def test_freezing():
    assert celsius_to_fahrenheit(0) == 32


def test_body_heat():
    assert fahrenheit_to_celsius(212) == 100


def test_kelvin():
    assert kelvin_to_celsius(273.15) == 0
