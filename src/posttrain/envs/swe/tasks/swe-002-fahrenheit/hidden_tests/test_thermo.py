"""Hidden tests for thermo."""

import pytest
from thermo import celsius_to_fahrenheit, fahrenheit_to_celsius


def test_boiling_and_freezing_points():
    """212 F is 100 C and 32 F is 0 C."""
    assert fahrenheit_to_celsius(212) == pytest.approx(100.0)
    assert fahrenheit_to_celsius(32) == pytest.approx(0.0)


def test_round_trip():
    """Converting there and back returns the start value."""
    for celsius in (-40.0, 0.0, 36.6, 100.0):
        assert fahrenheit_to_celsius(celsius_to_fahrenheit(celsius)) == pytest.approx(celsius)
