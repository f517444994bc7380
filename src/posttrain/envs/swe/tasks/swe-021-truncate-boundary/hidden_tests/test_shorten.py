"""Hidden tests for shorten."""

from shorten import truncate


def test_text_that_fits_exactly_is_unchanged():
    """Five characters in width 5."""
    assert truncate("hello", 5) == "hello"


def test_long_text_is_cut_to_width():
    """"hello world" in width 8: 5 characters and "..."."""
    assert truncate("hello world", 8) == "hello..."
    assert len(truncate("x" * 50, 10)) == 10
