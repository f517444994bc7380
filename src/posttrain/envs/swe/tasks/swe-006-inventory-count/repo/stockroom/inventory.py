"""An in-memory inventory of products by SKU."""


class Inventory:
    """Stock levels keyed by SKU."""

    def __init__(self) -> None:
        """Start with no stock."""
        self._counts: dict[str, int] = {}

    def add(self, sku: str, quantity: int = 1) -> None:
        """Add ``quantity`` units of ``sku``."""
        if quantity < 1:
            raise ValueError("quantity must be positive")
        self._counts[sku] = self._counts.get(sku, 0) + quantity

    def remove(self, sku: str, quantity: int = 1) -> None:
        """Take ``quantity`` units of ``sku`` out; raise ValueError if there are not enough."""
        have = self._counts.get(sku, 0)
        if quantity > have:
            raise ValueError(f"only {have} of {sku} in stock")
        self._counts[sku] = have - quantity

    def count(self, sku: str) -> int:
        """Return the units of ``sku`` in stock."""
        return self._counts[sku]
