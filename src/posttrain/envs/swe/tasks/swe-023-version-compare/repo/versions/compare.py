"""Parse and compare versions like "1.10.2"."""


def parse_version(text: str) -> tuple[str, ...]:
    """Split ``text`` into its dot-separated parts."""
    return tuple(text.strip().split("."))


def is_newer(candidate: str, current: str) -> bool:
    """Return whether version ``candidate`` is newer than ``current``."""
    return parse_version(candidate) > parse_version(current)
