"""Hidden tests for batcher."""

import pytest
from batcher import chunks


def test_short_last_chunk_is_kept():
    """7 items by 3: [0, 1, 2], [3, 4, 5], [6]."""
    assert chunks(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5], [6]]


def test_fewer_items_than_size_and_empty():
    """Two items by 5 is one chunk; no items, no chunks."""
    assert chunks("ab", 5) == [["a", "b"]]
    assert chunks([], 3) == []
    with pytest.raises(ValueError):
        chunks([1], 0)
