"""Hidden tests for lrucache."""

from lrucache import LRUCache


def test_get_refreshes_recency():
    """a, b stored; a read; c stored: b is the least recently used."""
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert cache.get("b") is None
    assert cache.get("a") == 1
    assert cache.get("c") == 3


def test_capacity_is_kept():
    """Three puts into capacity 2 keep two keys."""
    cache = LRUCache(2)
    for index, key in enumerate("xyz"):
        cache.put(key, index)
    assert len(cache) == 2
    assert cache.get("x") is None
