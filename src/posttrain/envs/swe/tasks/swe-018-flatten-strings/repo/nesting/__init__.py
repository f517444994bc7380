"""Flatten nested containers."""

from nesting.flat import flatten

__all__ = ["flatten"]
