"""Merge configuration dictionaries."""

from confmerge.merge import deep_merge

__all__ = ["deep_merge"]
