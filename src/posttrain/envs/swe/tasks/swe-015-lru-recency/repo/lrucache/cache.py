"""Least-recently-used cache with a fixed capacity."""

from collections import OrderedDict


class LRUCache:
    """Map keys to values, evicting the least recently used key when full."""

    def __init__(self, capacity: int) -> None:
        """Create an empty cache that holds at most ``capacity`` keys."""
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._data: OrderedDict[str, int] = OrderedDict()

    def get(self, key: str) -> int | None:
        """Return the value of ``key`` (marking it recently used), or None."""
        if key not in self._data:
            return None
        return self._data[key]

    def put(self, key: str, value: int) -> None:
        """Store ``value`` under ``key``, evicting the least recently used key if needed."""
        self._data[key] = value
        self._data.move_to_end(key)
        if len(self._data) > self.capacity:
            self._data.popitem(last=False)

    def __len__(self) -> int:
        """Return the number of stored keys."""
        return len(self._data)
