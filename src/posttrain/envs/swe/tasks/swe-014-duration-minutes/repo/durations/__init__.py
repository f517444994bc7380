"""Human-readable durations."""

from durations.parse import parse_duration

__all__ = ["parse_duration"]
