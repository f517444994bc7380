"""Hidden tests for calendar_utils."""

from calendar_utils import days_in_month, is_leap_year


def test_century_rules():
    """2000 and 2400 are leap years; 1900 and 2100 are not."""
    assert is_leap_year(2000) and is_leap_year(2400)
    assert not is_leap_year(1900) and not is_leap_year(2100)


def test_ordinary_years_and_february():
    """2024 is leap, 2023 is not; February 2000 has 29 days."""
    assert is_leap_year(2024) and not is_leap_year(2023)
    assert days_in_month(2000, 2) == 29
    assert days_in_month(2023, 2) == 28
