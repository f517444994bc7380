"""Hidden tests for binning."""

from binning import histogram


def test_upper_bound_falls_in_last_bin():
    """Bins [0, 0.5) and [0.5, 1]: 0 -> first; 0.5 and 1.0 -> last."""
    assert histogram([0.0, 0.5, 1.0], 0.0, 1.0, 2) == [1, 2]


def test_values_outside_are_ignored():
    """-1 and 11 are outside [0, 10]; 3 lands in bin 1 of 5 (width 2)."""
    assert histogram([-1.0, 3.0, 11.0], 0.0, 10.0, 5) == [0, 1, 0, 0, 0]
