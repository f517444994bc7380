"""Hidden tests for durations."""

import pytest
from durations import parse_duration


def test_mixed_units():
    """1h30m = 3600 + 1800; 2m5s = 120 + 5; 1h2m3s = 3723."""
    assert parse_duration("1h30m") == 5400
    assert parse_duration("2m5s") == 125
    assert parse_duration("1h 2m 3s") == 3723


def test_single_units_and_garbage():
    """Seconds alone work; text that is not a duration is rejected."""
    assert parse_duration("90s") == 90
    with pytest.raises(ValueError):
        parse_duration("soon")
