"""Hidden tests for nesting."""

from nesting import flatten


def test_strings_are_leaves():
    """"ab" stays one item; tuples and lists are opened."""
    assert flatten([1, [2, [3, "ab"]], ("c", b"d")]) == [1, 2, 3, "ab", "c", b"d"]


def test_plain_and_empty():
    """Flat input is unchanged; empty nests vanish."""
    assert flatten([1, 2]) == [1, 2]
    assert flatten([[], [[]]]) == []
