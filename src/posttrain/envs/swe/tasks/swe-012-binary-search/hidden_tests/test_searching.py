"""Hidden tests for searching."""

from searching import find_index


def test_every_element_is_found():
    """Each value of [1, 3, 5, 7, 9] at its own index."""
    items = [1, 3, 5, 7, 9]
    for index, value in enumerate(items):
        assert find_index(items, value) == index
    assert find_index([1, 3, 5], 5) == 2


def test_single_element_and_absent_values():
    """One-element list; absent values; empty list."""
    assert find_index([4], 4) == 0
    assert find_index([1, 3, 5], 4) == -1
    assert find_index([], 1) == -1
