"""Search sorted sequences."""

from searching.bisect_search import find_index

__all__ = ["find_index"]
