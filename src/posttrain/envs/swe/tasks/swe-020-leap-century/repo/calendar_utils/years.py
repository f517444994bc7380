"""Leap years and month lengths in the Gregorian calendar."""

_DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap_year(year: int) -> bool:
    """Return whether ``year`` has a 29th of February."""
    return year % 4 == 0 and year % 100 != 0


def days_in_month(year: int, month: int) -> int:
    """Return the number of days of ``month`` (1-12) in ``year``."""
    if not 1 <= month <= 12:
        raise ValueError("month must be 1 to 12")
    if month == 2 and is_leap_year(year):
        return 29
    return _DAYS[month - 1]
