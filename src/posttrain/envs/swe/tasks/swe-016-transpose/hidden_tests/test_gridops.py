"""Hidden tests for gridops."""

from gridops import identity, transpose


def test_rectangular_matrices():
    """2x3 -> 3x2 and 3x2 -> 2x3."""
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]
    assert transpose([[1, 2], [3, 4], [5, 6]]) == [[1, 3, 5], [2, 4, 6]]


def test_square_and_empty():
    """The identity is symmetric; the empty matrix stays empty."""
    assert transpose(identity(3)) == identity(3)
    assert transpose([]) == []
