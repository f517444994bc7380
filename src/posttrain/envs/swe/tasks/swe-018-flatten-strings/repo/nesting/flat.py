"""Flatten arbitrarily nested lists and tuples."""

from collections.abc import Iterable
from typing import Any


def flatten(items: Iterable[Any]) -> list[Any]:
    """Return the leaves of nested iterables in order; strings and bytes are leaves."""
    out: list[Any] = []
    for item in items:
        if isinstance(item, Iterable):
            out.extend(flatten(item))
        else:
            out.append(item)
    return out
