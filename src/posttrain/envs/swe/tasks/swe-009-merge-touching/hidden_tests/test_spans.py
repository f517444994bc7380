"""Hidden tests for spans."""

from spans import merge


def test_touching_intervals_merge():
    """[1, 2] and [2, 3] share the point 2."""
    assert merge([(1, 2), (2, 3)]) == [(1, 3)]


def test_unsorted_overlaps_and_gaps():
    """[1, 3] and [2, 4] overlap; [5, 6] stands apart."""
    assert merge([(5, 6), (1, 3), (2, 4)]) == [(1, 4), (5, 6)]
    assert merge([]) == []
