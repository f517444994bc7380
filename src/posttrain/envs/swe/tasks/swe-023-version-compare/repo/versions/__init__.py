"""Compare dotted version strings."""

from versions.compare import is_newer, parse_version

__all__ = ["is_newer", "parse_version"]
