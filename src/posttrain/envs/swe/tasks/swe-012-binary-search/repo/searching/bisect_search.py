"""Binary search."""

from collections.abc import Sequence


def find_index(items: Sequence[int], target: int) -> int:
    """Return an index of ``target`` in the sorted ``items``, or -1 when it is absent."""
    lo, hi = 0, len(items) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
