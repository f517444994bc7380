"""Hidden tests for ledger."""

from ledger import format_cents


def test_small_cents_are_zero_padded():
    """105 cents is one dollar and five cents."""
    assert format_cents(105) == "$1.05"
    assert format_cents(0) == "$0.00"
    assert format_cents(-5) == "-$0.05"


def test_thousands_separator():
    """123456789 cents = 1,234,567 dollars and 89 cents."""
    assert format_cents(123456789) == "$1,234,567.89"
