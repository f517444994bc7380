"""Roman numerals."""

from numerals.roman import to_roman

__all__ = ["to_roman"]
