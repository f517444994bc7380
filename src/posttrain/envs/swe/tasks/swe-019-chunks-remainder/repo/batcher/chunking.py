"""Fixed-size chunks of a sequence."""

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def chunks(items: Sequence[T], size: int) -> list[list[T]]:
    """Split ``items`` into lists of ``size`` items; the last one may be shorter."""
    if size < 1:
        raise ValueError("size must be at least 1")
    return [list(items[i:i + size]) for i in range(0, len(items) - size + 1, size)]
