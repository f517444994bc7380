"""Closed integer intervals."""

from spans.merging import merge

__all__ = ["merge"]
