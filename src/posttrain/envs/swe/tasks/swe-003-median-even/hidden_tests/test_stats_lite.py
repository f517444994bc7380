"""Hidden tests for stats_lite."""

import pytest
from stats_lite import median


def test_even_length_averages_the_middle_pair():
    """Sorted [1, 2, 3, 4]: middle pair 2 and 3, mean 2.5."""
    assert median([4, 1, 3, 2]) == pytest.approx(2.5)


def test_odd_length_takes_the_middle():
    """Sorted [1, 2, 3]: middle value 2."""
    assert median([3, 1, 2]) == 2


def test_empty_input_is_rejected():
    """No values, no median."""
    with pytest.raises(ValueError):
        median([])
