"""Basic operations on matrices stored as lists of rows."""


def transpose(matrix: list[list[int]]) -> list[list[int]]:
    """Return the transpose of ``matrix``: rows become columns."""
    if not matrix:
        return []
    return [[row[c] for row in matrix] for c in range(len(matrix))]


def identity(size: int) -> list[list[int]]:
    """Return the ``size`` x ``size`` identity matrix."""
    return [[1 if r == c else 0 for c in range(size)] for r in range(size)]
