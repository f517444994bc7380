"""Parse durations like "1h30m" into seconds."""

import re

_SECONDS_PER_UNIT = {"h": 3600, "m": 3600, "s": 1}


def parse_duration(text: str) -> int:
    """Return the number of seconds in ``text`` ("2h", "1h30m", "45s", "1h2m3s")."""
    compact = text.replace(" ", "")
    parts = re.findall(r"(\d+)([hms])", compact)
    if not parts or "".join(number + unit for number, unit in parts) != compact:
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(number) * _SECONDS_PER_UNIT[unit] for number, unit in parts)
