"""Merge overlapping intervals."""


def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Merge overlapping closed intervals and return them sorted by start."""
    result: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if result and start < result[-1][1]:
            result[-1] = (result[-1][0], max(result[-1][1], end))
        else:
            result.append((start, end))
    return result
