"""Track stock levels."""

from stockroom.inventory import Inventory

__all__ = ["Inventory"]
