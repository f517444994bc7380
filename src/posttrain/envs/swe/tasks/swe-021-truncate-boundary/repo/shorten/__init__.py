"""Shorten text for display."""

from shorten.text import truncate

__all__ = ["truncate"]
