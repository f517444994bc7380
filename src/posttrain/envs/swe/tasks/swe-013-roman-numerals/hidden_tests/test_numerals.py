"""Hidden tests for numerals."""

import pytest
from numerals import to_roman


def test_subtractive_tens():
    """90 = XC, 40 = XL, 1994 = M CM XC IV."""
    assert to_roman(90) == "XC"
    assert to_roman(40) == "XL"
    assert to_roman(1994) == "MCMXCIV"


def test_range_limits():
    """3999 is the largest; 0 is out of range."""
    assert to_roman(3999) == "MMMCMXCIX"
    with pytest.raises(ValueError):
        to_roman(0)
