"""Small descriptive statistics."""

from stats_lite.central import mean, median

__all__ = ["mean", "median"]
