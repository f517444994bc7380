"""Recursive dictionary merge for layered configuration."""

from typing import Any


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Return a new dict with ``override`` applied on top of ``base``, merging nested dicts."""
    merged = dict(base)
    for key, value in override.items():
        merged[key] = value
    return merged
