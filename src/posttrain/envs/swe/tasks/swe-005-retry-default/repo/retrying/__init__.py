"""Retry flaky calls."""

from retrying.policy import retry

__all__ = ["retry"]
