"""Call a function again when it raises."""

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def retry(func: Callable[[], T], attempts: int = 1) -> T:
    """Call ``func`` up to ``attempts`` times (3 by default) and return its first result.

    The last exception is re-raised when every attempt fails.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    last_error: Exception | None = None
    for _ in range(attempts):
        try:
            return func()
        except Exception as exc:
            last_error = exc
    assert last_error is not None
    raise last_error
