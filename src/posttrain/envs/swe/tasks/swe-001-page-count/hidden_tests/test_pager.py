"""Hidden tests for pager."""

from pager import page_count, page_slice


def test_partial_last_page_is_counted():
    """Ten items, three per page: pages of 3, 3, 3 and 1."""
    assert page_count(10, 3) == 4


def test_exact_multiple_and_empty():
    """Exact multiples need no extra page; no items need no page."""
    assert page_count(9, 3) == 3
    assert page_count(0, 5) == 0
    assert page_count(1, 5) == 1


def test_last_page_slice():
    """The fourth page holds the single remaining item."""
    items = [str(i) for i in range(10)]
    assert page_slice(items, 4, 3) == ["9"]
