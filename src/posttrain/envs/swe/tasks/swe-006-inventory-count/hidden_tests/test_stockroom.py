"""Hidden tests for stockroom."""

import pytest
from stockroom import Inventory


def test_unknown_product_counts_zero():
    """Never added: zero in stock."""
    assert Inventory().count("sku-1") == 0


def test_add_and_remove():
    """Add 5, remove 2: 3 left; removing 4 more is refused."""
    inventory = Inventory()
    inventory.add("sku-1", 5)
    inventory.remove("sku-1", 2)
    assert inventory.count("sku-1") == 3
    with pytest.raises(ValueError):
        inventory.remove("sku-1", 4)
